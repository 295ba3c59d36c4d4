//! The review service: when a conversation segment closes, grades each memory retrieval handed
//! the assistant during it — Again, Hard, Good or Easy, by an LLM or by the local grader — and
//! moves its FSRS state accordingly, once per segment and never backwards in time. It also grades
//! on request (GradeMemories), reports the grades of a space (GetReviewStats) and an episode's
//! state and retrievability now (GetMemoryState).

#![forbid(unsafe_code)]

pub mod app;
pub mod apply;
pub mod config;
pub mod error;
pub mod grading;
pub mod grpc;
pub mod metrics;
pub mod proto;
pub mod segments;
pub mod service;

pub use app::App;
pub use config::ReviewSettings;
