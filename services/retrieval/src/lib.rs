//! The retrieval service: reads memory for assistants. RetrieveMemory and ContextPreRetrieve run
//! the hybrid pipeline of `engram-recall`; ListEntries, GetSummary and ExportSpace read a space
//! as it is.

#![forbid(unsafe_code)]

pub mod app;
pub mod config;
pub mod error;
pub mod grpc;
pub mod proto;
pub mod service;

pub use app::App;
pub use config::RetrievalSettings;
