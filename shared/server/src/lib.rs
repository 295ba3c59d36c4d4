//! What every Engram gRPC service shares: layered settings (defaults, optional file, `ENGRAM_*`
//! environment), bearer-token access control as a tower layer, the gRPC server with health and
//! reflection, and graceful shutdown on SIGTERM/SIGINT.

#![forbid(unsafe_code)]

pub mod activity;
pub mod auth;
pub mod convert;
pub mod database;
pub mod deadline;
pub mod grpc;
pub mod metrics;
pub mod paging;
pub mod settings;
pub mod shutdown;
pub mod startup;
pub mod status;
pub mod time;
pub mod tls;

pub use auth::{AccessGrant, AuthLayer, TokenRegistry, authorized_scope};
pub use grpc::GrpcServer;
pub use settings::{
    AuthSettings, DatabaseSettings, GrpcSettings, SynchronousCommit, load_settings,
};
pub use shutdown::shutdown_signal;
pub use startup::{Foundation, run_service};
pub use tls::TlsSettings;
