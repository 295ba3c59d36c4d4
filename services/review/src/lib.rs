//! The review service: keeps the FSRS state of episodic memories. It answers for an episode's
//! state and retrievability now; LLM grading of retrieved memories after a segment closes comes
//! with the review issue.

#![forbid(unsafe_code)]

pub mod app;
pub mod config;
pub mod error;
pub mod grpc;

pub use app::App;
pub use config::ReviewSettings;
