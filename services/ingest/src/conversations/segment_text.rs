//! A turn of a closed segment as the describers read it (a module of its own, so that the
//! describers and the LLM's prompt can both use it without importing each other).

use chrono::{DateTime, Utc};
use engram_core::SpeakerRole;

/// A turn of a closed segment, as the describers read it.
#[derive(Debug, Clone)]
pub struct SegmentText {
    pub role: SpeakerRole,
    pub content: String,
    pub spoken_at: DateTime<Utc>,
}
