//! The ingest service: everything that writes memory, and the user's controls over it.
//!
//! A `Remember` runs the write path: normalize and fingerprint the text (SimHash), extract
//! metadata, score importance, then — in a transaction holding the space's lock, shared with the
//! other writes waiting at that moment (group commit) — honour memory off, incognito and
//! tombstones, merge into a near-duplicate or insert, enforce the soft cap and append to the audit
//! trail. Forget, pin, settings, incognito and the natural-language commands
//! are carried out the same way.

#![forbid(unsafe_code)]

pub mod app;
pub mod backfill;
pub mod bus;
pub mod commands;
pub mod config;
pub mod controls;
pub mod conversations;
pub mod error;
pub mod group_commit;
pub mod grpc;
pub mod import;
pub mod metrics;
pub mod proto;
pub mod retention;
pub mod service;
pub mod write_path;

pub use app::App;
pub use config::IngestSettings;
