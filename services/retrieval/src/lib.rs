//! The retrieval service: reads memory for assistants. It lists what a space holds now; hybrid
//! BM25 + vector search, ranking and the Markdown rendering come with the retrieval issue.

#![forbid(unsafe_code)]

pub mod app;
pub mod config;
pub mod error;
pub mod grpc;

pub use app::App;
pub use config::RetrievalSettings;
