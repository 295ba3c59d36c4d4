//! The events conversations put in the outbox, built beside the writes that store them.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use engram_core::{ConversationId, Scope};
use engram_proto::v1;
use engram_store::outbox::NewOutboxEvent;
use prost::Message as _;
use uuid::Uuid;

use engram_bus::queues::routes::{
    SEGMENT_CLOSED as SEGMENT_CLOSED_KEY, SEGMENT_CLOSED_TYPE,
    SEGMENTATION_REQUESTED as SEGMENTATION_REQUESTED_KEY, SEGMENTATION_REQUESTED_TYPE,
};

fn proto_scope(scope: &Scope) -> v1::Scope {
    v1::Scope {
        user_id: scope.user_id.to_string(),
        space: scope.space.to_string(),
    }
}

/// Turns were appended (or a close asked for): segmentation should look at the conversation.
pub fn segmentation_requested(
    scope: &Scope,
    conversation: ConversationId,
    close: bool,
    trace_headers: HashMap<String, String>,
) -> NewOutboxEvent {
    let event = v1::SegmentationRequested {
        scope: Some(proto_scope(scope)),
        conversation_id: conversation.to_string(),
        close,
        requested_at: Some(engram_server::time::to_proto(Utc::now())),
    };
    NewOutboxEvent {
        message_id: Uuid::now_v7(),
        routing_key: SEGMENTATION_REQUESTED_KEY.into(),
        type_name: SEGMENTATION_REQUESTED_TYPE.into(),
        payload: event.encode_to_vec(),
        trace_headers,
    }
}

/// What a closed segment hands the review service.
#[derive(Debug, Clone)]
pub struct ClosedSegmentEvent<'a> {
    pub scope: &'a Scope,
    pub conversation: ConversationId,
    pub segment_id: Uuid,
    pub episode_id: Option<Uuid>,
    pub first_turn_index: i32,
    pub last_turn_index: i32,
    pub reason: &'a str,
    pub context: Vec<v1::Message>,
    pub pending_reviews: Vec<v1::PendingReview>,
    pub closed_at: DateTime<Utc>,
}

/// The SegmentClosed event; its message id is the segment's, so a segment announced twice (a
/// redelivered segmentation request) is one message to its consumers.
pub fn segment_closed(event: ClosedSegmentEvent<'_>) -> NewOutboxEvent {
    let closed_at = engram_server::time::to_proto(event.closed_at);
    let proto = v1::SegmentClosed {
        scope: Some(proto_scope(event.scope)),
        conversation_id: event.conversation.to_string(),
        episode_id: event
            .episode_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        closed_at: Some(closed_at),
        context: event.context,
        pending_reviews: event.pending_reviews,
        reviewed_at: Some(closed_at),
        first_turn_index: u32::try_from(event.first_turn_index).unwrap_or_default(),
        last_turn_index: u32::try_from(event.last_turn_index).unwrap_or_default(),
        segment_id: event.segment_id.to_string(),
        reason: event.reason.to_owned(),
    };
    NewOutboxEvent {
        message_id: event.segment_id,
        routing_key: SEGMENT_CLOSED_KEY.into(),
        type_name: SEGMENT_CLOSED_TYPE.into(),
        payload: proto.encode_to_vec(),
        trace_headers: HashMap::new(),
    }
}
