//! Engram's domain logic, free of I/O so that every rule is unit-tested without a database:
//! validated request values, text normalization for fingerprinting, 64-bit SimHash with banded
//! near-duplicate lookup keys, metadata extraction, the importance heuristics, the capacity
//! (trim) policy and the natural-language memory commands.

#![forbid(unsafe_code)]

pub mod activity;
pub mod backoff;
pub mod capacity;
pub mod category;
pub mod commands;
pub mod conflict;
pub mod episode;
pub mod importance;
pub mod memory_state;
pub mod metadata;
pub mod normalize;
pub mod redact;
pub mod retention;
pub mod retrieval;
pub mod review;
pub mod sanitize;
pub mod segmentation;
pub mod simhash;
pub mod speaker;
pub mod statement;
pub mod validate;
pub mod when;

pub use capacity::{RetentionPolicy, Scores, TrimCandidate, TrimPlan};
pub use category::{Category, MemoryKind, SpeakerRole};
pub use simhash::SimHash;
pub use validate::{
    ConversationId, MemoryId, MemoryText, Scope, SpaceName, UserId, ValidationError,
};
