//! Conversions at the gRPC edge: request scopes in, stored memories out.

use engram_core::{Category, MemoryKind, Scope, SpeakerRole, ValidationError};
use engram_proto::v1;
use engram_store::memories::MemoryRecord;

use crate::time::{to_proto, to_proto_opt};

/// Parses the required `scope` field of a request.
pub fn scope_from_proto(scope: Option<v1::Scope>) -> Result<Scope, ValidationError> {
    let scope = scope.ok_or_else(|| ValidationError::new("scope", "is required"))?;
    Scope::parse("scope", &scope.user_id, &scope.space)
}

/// The proto enum of a category; `None` for UNSPECIFIED. Unknown numbers are an error.
pub fn category_from_proto(field: &str, raw: i32) -> Result<Option<Category>, ValidationError> {
    let category = v1::Category::try_from(raw)
        .map_err(|_| ValidationError::new(field, format!("{raw} is not a known category")))?;
    Ok(match category {
        v1::Category::Unspecified => None,
        v1::Category::Fact => Some(Category::Fact),
        v1::Category::Preference => Some(Category::Preference),
        v1::Category::Experience => Some(Category::Experience),
        v1::Category::Guideline => Some(Category::Guideline),
        v1::Category::Decision => Some(Category::Decision),
        v1::Category::Todo => Some(Category::Todo),
        v1::Category::Goal => Some(Category::Goal),
    })
}

pub fn category_to_proto(category: Category) -> v1::Category {
    match category {
        Category::Fact => v1::Category::Fact,
        Category::Preference => v1::Category::Preference,
        Category::Experience => v1::Category::Experience,
        Category::Guideline => v1::Category::Guideline,
        Category::Decision => v1::Category::Decision,
        Category::Todo => v1::Category::Todo,
        Category::Goal => v1::Category::Goal,
    }
}

/// The speaker role of a write; UNSPECIFIED means the user.
pub fn role_from_proto(field: &str, raw: i32) -> Result<SpeakerRole, ValidationError> {
    let role = v1::SpeakerRole::try_from(raw)
        .map_err(|_| ValidationError::new(field, format!("{raw} is not a known speaker role")))?;
    Ok(match role {
        v1::SpeakerRole::Unspecified | v1::SpeakerRole::User => SpeakerRole::User,
        v1::SpeakerRole::Assistant => SpeakerRole::Assistant,
        v1::SpeakerRole::System => SpeakerRole::System,
    })
}

pub fn role_to_proto(role: SpeakerRole) -> v1::SpeakerRole {
    match role {
        SpeakerRole::User => v1::SpeakerRole::User,
        SpeakerRole::Assistant => v1::SpeakerRole::Assistant,
        SpeakerRole::System => v1::SpeakerRole::System,
    }
}

pub fn kind_to_proto(kind: MemoryKind) -> v1::MemoryKind {
    match kind {
        MemoryKind::Semantic => v1::MemoryKind::Semantic,
        MemoryKind::Episodic => v1::MemoryKind::Episodic,
    }
}

/// The proto enum of a memory kind; `None` for UNSPECIFIED. Unknown numbers are an error.
pub fn kind_from_proto(field: &str, raw: i32) -> Result<Option<MemoryKind>, ValidationError> {
    match v1::MemoryKind::try_from(raw) {
        Ok(v1::MemoryKind::Unspecified) => Ok(None),
        Ok(v1::MemoryKind::Semantic) => Ok(Some(MemoryKind::Semantic)),
        Ok(v1::MemoryKind::Episodic) => Ok(Some(MemoryKind::Episodic)),
        Err(_) => Err(ValidationError::new(
            field,
            format!("{raw} is not a known memory kind"),
        )),
    }
}

/// A stored memory as clients see it (never with its embedding).
pub fn memory_to_proto(record: &MemoryRecord) -> v1::Memory {
    let kind = kind_to_proto(record.memory_kind());
    let category = record
        .category
        .as_deref()
        .and_then(Category::from_stored)
        .map_or(v1::Category::Unspecified, category_to_proto);
    let role =
        SpeakerRole::from_stored(&record.role).map_or(v1::SpeakerRole::Unspecified, role_to_proto);
    let fsrs = match (record.stability, record.difficulty, record.last_reviewed_at) {
        (Some(stability), Some(difficulty), Some(last_reviewed_at)) => Some(v1::FsrsState {
            stability,
            difficulty,
            last_reviewed_at: Some(to_proto(last_reviewed_at)),
        }),
        _ => None,
    };
    v1::Memory {
        id: record.id.to_string(),
        scope: Some(v1::Scope {
            user_id: record.user_id.to_string(),
            space: record.space.clone(),
        }),
        kind: kind.into(),
        text: record.text.clone(),
        title: record.title.clone().unwrap_or_default(),
        category: category.into(),
        role: role.into(),
        tags: record.tags.clone(),
        source_ids: record.source_ids.clone(),
        importance: record.importance,
        metadata_confidence: record.metadata_confidence,
        pinned: record.pinned,
        manually_saved: record.manually_saved,
        repeat_count: u32::try_from(record.repeat_count).unwrap_or_default(),
        needs_embedding: record.needs_embedding,
        conversation_id: record
            .conversation_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        created_at: Some(to_proto(record.created_at)),
        updated_at: Some(to_proto(record.updated_at)),
        valid_at: to_proto_opt(record.valid_at),
        invalid_at: to_proto_opt(record.invalid_at),
        last_scores: record.scores().map(|scores| v1::Scores {
            relevance: scores.relevance,
            recency: scores.recency,
            importance: scores.importance,
            total: scores.total,
            computed_at: Some(to_proto(scores.computed_at)),
        }),
        fsrs,
        surprise: record.surprise.unwrap_or_default(),
        messages: messages_to_proto(record.messages.as_ref()),
        start_at: to_proto_opt(record.start_at),
        end_at: to_proto_opt(record.end_at),
        embedding_model: record.embedding_model.clone().unwrap_or_default(),
        source_episode_ids: record
            .source_episode_ids
            .iter()
            .map(ToString::to_string)
            .collect(),
        superseded_by: record
            .superseded_by
            .map(|id| id.to_string())
            .unwrap_or_default(),
        structured_summary: record
            .structured_summary
            .as_ref()
            .map(structured_summary_to_proto),
        inactive_since: to_proto_opt(record.inactive_since),
    }
}

/// A stored structured summary (`{"facts": [...], ...}`); missing or malformed lists are empty.
pub fn structured_summary_to_proto(stored: &serde_json::Value) -> v1::StructuredSummary {
    let list = |key: &str| -> Vec<String> {
        stored
            .get(key)
            .and_then(serde_json::Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| item.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    v1::StructuredSummary {
        facts: list("facts"),
        preferences: list("preferences"),
        decisions: list("decisions"),
        todos: list("todos"),
        goals: list("goals"),
        entities: list("entities"),
        experiences: list("experiences"),
        guidelines: list("guidelines"),
    }
}

/// An episode's stored excerpt (`[{"role": ..., "content": ...}]`) as proto messages; entries of
/// another shape are skipped rather than failing the whole response.
fn messages_to_proto(messages: Option<&serde_json::Value>) -> Vec<v1::Message> {
    let Some(messages) = messages.and_then(serde_json::Value::as_array) else {
        return Vec::new();
    };
    messages
        .iter()
        .filter_map(|message| {
            let role = SpeakerRole::from_stored(message.get("role")?.as_str()?)
                .map_or(v1::SpeakerRole::Unspecified, role_to_proto);
            Some(v1::Message {
                role: role.into(),
                content: message.get("content")?.as_str()?.to_owned(),
            })
        })
        .collect()
}
