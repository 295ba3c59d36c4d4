//! The events of the bus and the queues that consume them: one list, so that whoever publishes
//! declares every queue its events go to (an event published before its consumer ever ran waits
//! in that queue instead of being dropped by the exchange).

use std::time::Duration;

use crate::QueueSpec;

/// Routing keys and protobuf types of every Engram event.
pub mod routes {
    pub const EMBEDDING_REQUESTED: &str = "memory.embedding.requested";
    pub const EMBEDDING_REQUESTED_TYPE: &str = "engram.v1.EmbeddingRequested";
    pub const SEGMENTATION_REQUESTED: &str = "conversation.segmentation.requested";
    pub const SEGMENTATION_REQUESTED_TYPE: &str = "engram.v1.SegmentationRequested";
    pub const SEGMENT_CLOSED: &str = "conversation.segment.closed";
    pub const SEGMENT_CLOSED_TYPE: &str = "engram.v1.SegmentClosed";
}

/// The ingest service's embedding consumer.
pub fn embedding_requested(retry_delay: Duration) -> QueueSpec {
    QueueSpec {
        name: "ingest.embedding-requested",
        bindings: vec![routes::EMBEDDING_REQUESTED],
        retry_delay,
    }
}

/// The ingest service's segmentation consumer.
pub fn segmentation_requested(retry_delay: Duration) -> QueueSpec {
    QueueSpec {
        name: "ingest.segmentation-requested",
        bindings: vec![routes::SEGMENTATION_REQUESTED],
        retry_delay,
    }
}

/// The review service's consumer of closed segments.
pub fn segment_closed(retry_delay: Duration) -> QueueSpec {
    QueueSpec {
        name: "review.segment-closed",
        bindings: vec![routes::SEGMENT_CLOSED],
        retry_delay,
    }
}

/// Every consumer queue.
pub fn all(retry_delay: Duration) -> Vec<QueueSpec> {
    vec![
        embedding_requested(retry_delay),
        segmentation_requested(retry_delay),
        segment_closed(retry_delay),
    ]
}
