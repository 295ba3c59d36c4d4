//! ImportMemories: facts and episodes from another memory store (or a test fixture), stored as
//! given. What the source cannot know (tags, importance, category, the SimHash, an episode's
//! initial FSRS state) is derived the way Remember derives it. Ids are UUIDv5 of (user, space,
//! client id), so importing a batch twice creates nothing new; near-duplicates are not merged and
//! the capacity policy does not trim (an import moves a store as it is).

use std::collections::HashSet;

use chrono::{DateTime, Duration, Utc};
use engram_core::memory_state::{STABILITY_RANGE, initial_state};
use engram_core::normalize::normalize_for_fingerprint;
use engram_core::validate::{check_label, parse_labels};
use engram_core::{
    Category, ConversationId, MemoryKind, MemoryText, Scope, SimHash, SpeakerRole, ValidationError,
    importance, metadata, when,
};
use engram_proto::v1;
use engram_server::convert::{category_from_proto, kind_from_proto, role_from_proto};
use engram_server::time::{from_proto, from_proto_opt};
use engram_store::conversations;
use engram_store::transfer::{self, ImportRow};
use uuid::Uuid;

use engram_server::deadline::mark_write_started;

use crate::error::IngestError;
use crate::write_path::{MAX_TAG_CHARS, MemoryWriter};

pub const MAX_IMPORT_BATCH: usize = 500;
pub const MAX_CLIENT_ID_CHARS: usize = 256;
pub const MAX_TITLE_CHARS: usize = 512;
pub const MAX_EPISODE_MESSAGES: usize = 200;
/// Characters of an episode's excerpt in all: with the other per-entry limits, one entry stays far
/// below the size of a response (a page always holds at least one entry).
pub const MAX_EPISODE_EXCERPT_CHARS: usize = 65_536;
const MAX_TAGS: usize = 32;
const MAX_SOURCE_IDS: usize = 32;
const MAX_SOURCE_ID_CHARS: usize = 256;
/// Clock skew tolerated on a client's created_at.
const FUTURE_TOLERANCE: Duration = Duration::minutes(5);

/// Namespace of import ids (a fixed random UUID: changing it would break idempotency).
const IMPORT_NAMESPACE: Uuid = Uuid::from_u128(0x3c1f_9a52_7be4_4d0e_9f61_d2a8_50b7_e4c3);

/// Engram's id of an imported entry. A newline separates the parts: space names cannot hold one.
pub fn import_id(scope: &Scope, client_id: &str) -> Uuid {
    let name = format!("{}\n{}\n{client_id}", scope.user_id, scope.space.as_str());
    Uuid::new_v5(&IMPORT_NAMESPACE, name.as_bytes())
}

/// What validation needs beyond the entry itself.
#[derive(Debug, Clone)]
pub struct ImportLimits {
    pub max_text_chars: usize,
    /// The model this Engram embeds with; given embeddings must come from it.
    pub embedding_model: Option<String>,
    /// The store's vector dimension.
    pub dimension: usize,
    pub now: DateTime<Utc>,
}

/// Most neighbours on each side an imported fact may be searched with.
pub const MAX_CONTEXT_TURNS: u32 = 5;
/// Neighbours on each side that the facts of an import reading as a dialog are searched with when
/// the request does not say: on the development set's dialogs, with the default ranking, 1 put
/// more evidence in the first 10 than 0, 2 or 3 (docs/eval/dialogs.md, "How the import's
/// context was chosen").
pub const DIALOG_CONTEXT_TURNS: u32 = 1;
/// How far apart in time two facts may be to be each other's context (one sitting of a chat).
const CONTEXT_WINDOW: chrono::Duration = chrono::Duration::hours(1);

/// An entry ready to insert, with the client's id kept for the response.
#[derive(Debug, Clone)]
pub struct ParsedImport {
    pub client_id: String,
    pub row: ImportRow,
}

fn check_unit(field: String, value: f64) -> Result<f64, ValidationError> {
    if value.is_finite() && (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(ValidationError::new(
            field,
            format!("must be between 0 and 1, got {value}"),
        ))
    }
}

/// Times a client reports of the past (creation, an episode's span, its last review): a clock a
/// little ahead is tolerated, a date to come is not (an episode "reviewed" in 2099 would never
/// decay).
fn not_in_the_future(
    field: String,
    at: DateTime<Utc>,
    limits: &ImportLimits,
) -> Result<(), ValidationError> {
    if at > limits.now + FUTURE_TOLERANCE {
        return Err(ValidationError::new(field, "must not be in the future"));
    }
    Ok(())
}

fn parse_client_id(field: String, raw: &str) -> Result<String, ValidationError> {
    check_label(&field, raw, MAX_CLIENT_ID_CHARS)?;
    Ok(raw.to_owned())
}

fn parse_embedding(
    field: &str,
    raw: &v1::ImportedMemory,
    limits: &ImportLimits,
) -> Result<Option<(Vec<f32>, String)>, ValidationError> {
    if raw.embedding.is_empty() {
        return Ok(None);
    }
    let model = raw.embedding_model.trim();
    if model.is_empty() {
        return Err(ValidationError::new(
            format!("{field}.embedding_model"),
            "is required with an embedding",
        ));
    }
    if let Some(expected) = limits.embedding_model.as_deref()
        && model != expected
    {
        return Err(ValidationError::new(
            format!("{field}.embedding_model"),
            format!(
                "is {model:?}, but this Engram embeds with {expected:?}; omit the embedding to have Engram compute it"
            ),
        ));
    }
    if raw.embedding.len() != limits.dimension {
        return Err(ValidationError::new(
            format!("{field}.embedding"),
            format!(
                "has {} dimensions; the store holds {}",
                raw.embedding.len(),
                limits.dimension
            ),
        ));
    }
    if raw.embedding.iter().any(|x| !x.is_finite()) {
        return Err(ValidationError::new(
            format!("{field}.embedding"),
            "must hold finite numbers only",
        ));
    }
    // A zero vector has no direction: its cosine to anything is undefined (NaN in pgvector).
    let norm: f32 = raw.embedding.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm < 1e-6 {
        return Err(ValidationError::new(
            format!("{field}.embedding"),
            "must not be the zero vector",
        ));
    }
    Ok(Some((raw.embedding.clone(), model.to_owned())))
}

/// The episode-only fields of an entry.
struct EpisodeFields {
    title: String,
    messages: serde_json::Value,
    surprise: f64,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
    stability: f64,
    difficulty: f64,
    last_reviewed_at: DateTime<Utc>,
}

fn parse_episode(
    field: &str,
    raw: &v1::ImportedMemory,
    created_at: DateTime<Utc>,
    limits: &ImportLimits,
) -> Result<EpisodeFields, ValidationError> {
    let title = raw.title.trim();
    if title.is_empty() {
        return Err(ValidationError::new(
            format!("{field}.title"),
            "is required for an episode",
        ));
    }
    check_label(&format!("{field}.title"), title, MAX_TITLE_CHARS)?;
    if raw.category != v1::Category::Unspecified as i32 {
        return Err(ValidationError::new(
            format!("{field}.category"),
            "applies to facts only; leave it unspecified for an episode",
        ));
    }
    let messages = parse_excerpt(field, raw, limits)?;
    let surprise = check_unit(format!("{field}.surprise"), raw.surprise.unwrap_or(0.0))?;
    let end_at =
        from_proto_opt(&format!("{field}.end_at"), raw.end_at.as_ref())?.unwrap_or(created_at);
    let start_at =
        from_proto_opt(&format!("{field}.start_at"), raw.start_at.as_ref())?.unwrap_or(end_at);
    if start_at > end_at {
        return Err(ValidationError::new(
            format!("{field}.start_at"),
            "must not be after end_at",
        ));
    }
    not_in_the_future(format!("{field}.end_at"), end_at, limits)?;
    let (stability, difficulty, last_reviewed_at) = match &raw.fsrs {
        Some(state) => parse_fsrs_state(field, state, limits)?,
        None => {
            let (stability, difficulty) = initial_state(surprise);
            (stability, difficulty, end_at)
        }
    };
    Ok(EpisodeFields {
        title: title.to_owned(),
        messages,
        surprise,
        start_at,
        end_at,
        stability,
        difficulty,
        last_reviewed_at,
    })
}

/// An episode's conversation excerpt: its turns, checked like turns of a conversation.
fn parse_excerpt(
    field: &str,
    raw: &v1::ImportedMemory,
    limits: &ImportLimits,
) -> Result<serde_json::Value, ValidationError> {
    if raw.messages.len() > MAX_EPISODE_MESSAGES {
        return Err(ValidationError::new(
            format!("{field}.messages"),
            format!(
                "has {} turns; the limit is {MAX_EPISODE_MESSAGES}",
                raw.messages.len()
            ),
        ));
    }
    let excerpt_chars: usize = raw
        .messages
        .iter()
        .map(|message| message.content.chars().count())
        .sum();
    if excerpt_chars > MAX_EPISODE_EXCERPT_CHARS {
        return Err(ValidationError::new(
            format!("{field}.messages"),
            format!(
                "hold {excerpt_chars} characters in all; the limit is {MAX_EPISODE_EXCERPT_CHARS}"
            ),
        ));
    }
    let mut messages = Vec::with_capacity(raw.messages.len());
    for (index, message) in raw.messages.iter().enumerate() {
        let turn = format!("{field}.messages[{index}]");
        let role = role_from_proto(&format!("{turn}.role"), message.role)?;
        let content = MemoryText::parse(
            &format!("{turn}.content"),
            &message.content,
            limits.max_text_chars,
        )?;
        messages.push(serde_json::json!({"role": role.as_str(), "content": content.as_str()}));
    }
    Ok(serde_json::Value::Array(messages))
}

/// An episode's FSRS state as its store had it: stability, difficulty and the last review.
fn parse_fsrs_state(
    field: &str,
    state: &v1::FsrsState,
    limits: &ImportLimits,
) -> Result<(f64, f64, DateTime<Utc>), ValidationError> {
    if !STABILITY_RANGE.contains(&state.stability) {
        return Err(ValidationError::new(
            format!("{field}.fsrs.stability"),
            format!(
                "must be between {} and {} days, got {}",
                STABILITY_RANGE.start(),
                STABILITY_RANGE.end(),
                state.stability
            ),
        ));
    }
    if !(state.difficulty.is_finite() && (1.0..=10.0).contains(&state.difficulty)) {
        return Err(ValidationError::new(
            format!("{field}.fsrs.difficulty"),
            format!("must be between 1 and 10, got {}", state.difficulty),
        ));
    }
    let reviewed = state.last_reviewed_at.as_ref().ok_or_else(|| {
        ValidationError::new(
            format!("{field}.fsrs.last_reviewed_at"),
            "is required with an FSRS state",
        )
    })?;
    let reviewed = from_proto(&format!("{field}.fsrs.last_reviewed_at"), reviewed)?;
    not_in_the_future(format!("{field}.fsrs.last_reviewed_at"), reviewed, limits)?;
    Ok((state.stability, state.difficulty, reviewed))
}

/// Fields that only episodes carry must not come with a fact.
fn reject_episode_fields(field: &str, raw: &v1::ImportedMemory) -> Result<(), ValidationError> {
    let present = [
        ("title", !raw.title.is_empty()),
        ("messages", !raw.messages.is_empty()),
        ("start_at", raw.start_at.is_some()),
        ("end_at", raw.end_at.is_some()),
        ("surprise", raw.surprise.is_some()),
        ("fsrs", raw.fsrs.is_some()),
    ];
    match present.iter().find(|(_, present)| *present) {
        Some((name, _)) => Err(ValidationError::new(
            format!("{field}.{name}"),
            "applies to episodes only",
        )),
        None => Ok(()),
    }
}

/// What Remember would derive from an entry's text, for what the import does not give.
struct Derived {
    importance: f64,
    tags: Vec<String>,
    metadata_confidence: f64,
    simhash: i64,
    text_digest: String,
}

/// Metadata from the text (and the title of an episode), the importance and tags unless given,
/// and the fingerprint. `said_at` anchors relative dates ("next Wednesday").
fn derive(
    field: &str,
    raw: &v1::ImportedMemory,
    text: &MemoryText,
    tags: Vec<String>,
    said_at: DateTime<Utc>,
) -> Result<Derived, ValidationError> {
    let described = if raw.title.trim().is_empty() {
        text.as_str().to_owned()
    } else {
        format!("{}\n{}", raw.title.trim(), text.as_str())
    };
    let extracted = metadata::extract(&described);
    let importance = match raw.importance {
        Some(given) => check_unit(format!("{field}.importance"), given)?,
        None => importance::classify(
            text.as_str(),
            raw.manually_saved || raw.pinned,
            extracted.confidence,
        )
        .score(),
    };
    let tags = if tags.is_empty() {
        // The days relative words meant when the entry was said (valid_at, else created_at, as
        // the Markdown resolves them), then what the text names.
        crate::write_path::merge_labels(
            &when::date_tags(text.as_str(), said_at),
            &extracted.tags,
            MAX_TAGS,
        )
    } else {
        tags
    };
    let normalized = normalize_for_fingerprint(text.as_str());
    Ok(Derived {
        importance,
        tags,
        metadata_confidence: extracted.confidence.clamp(0.0, 1.0),
        simhash: SimHash::of_normalized(&normalized).as_i64(),
        text_digest: engram_store::write_path::hex(&crate::write_path::text_digest(&normalized)),
    })
}

/// When an entry was written, became true and stopped being true: written no later than now,
/// and not invalid before it was valid.
#[expect(
    clippy::type_complexity,
    reason = "three times, each named where it is used"
)]
fn parse_times(
    field: &str,
    raw: &v1::ImportedMemory,
    limits: &ImportLimits,
) -> Result<(DateTime<Utc>, Option<DateTime<Utc>>, Option<DateTime<Utc>>), ValidationError> {
    let created_at = from_proto_opt(&format!("{field}.created_at"), raw.created_at.as_ref())?
        .unwrap_or(limits.now);
    not_in_the_future(format!("{field}.created_at"), created_at, limits)?;
    let valid_at = from_proto_opt(&format!("{field}.valid_at"), raw.valid_at.as_ref())?;
    let invalid_at = from_proto_opt(&format!("{field}.invalid_at"), raw.invalid_at.as_ref())?;
    if let (Some(valid), Some(invalid)) = (valid_at.or(Some(created_at)), invalid_at)
        && invalid < valid
    {
        return Err(ValidationError::new(
            format!("{field}.invalid_at"),
            "must not be before valid_at",
        ));
    }
    Ok((created_at, valid_at, invalid_at))
}

/// Validates one entry; `field` names it in errors (`memories[3]`).
pub fn parse_entry(
    field: &str,
    scope: &Scope,
    raw: &v1::ImportedMemory,
    limits: &ImportLimits,
) -> Result<ParsedImport, ValidationError> {
    let client_id = parse_client_id(format!("{field}.client_id"), &raw.client_id)?;
    let kind = kind_from_proto(&format!("{field}.kind"), raw.kind)?.ok_or_else(|| {
        ValidationError::new(format!("{field}.kind"), "is required: SEMANTIC or EPISODIC")
    })?;
    let text = MemoryText::parse(&format!("{field}.text"), &raw.text, limits.max_text_chars)?;
    let role: SpeakerRole = role_from_proto(&format!("{field}.role"), raw.role)?;
    let tags = parse_labels(&format!("{field}.tags"), &raw.tags, MAX_TAGS, MAX_TAG_CHARS)?;
    let source_ids = parse_labels(
        &format!("{field}.source_ids"),
        &raw.source_ids,
        MAX_SOURCE_IDS,
        MAX_SOURCE_ID_CHARS,
    )?;
    let conversation_id = if raw.conversation_id.is_empty() {
        None
    } else {
        Some(
            ConversationId::parse(&format!("{field}.conversation_id"), &raw.conversation_id)?
                .as_uuid(),
        )
    };
    let (created_at, valid_at, invalid_at) = parse_times(field, raw, limits)?;
    let embedding = parse_embedding(field, raw, limits)?;

    let derived = derive(field, raw, &text, tags, valid_at.unwrap_or(created_at))?;
    let mut row = ImportRow {
        id: import_id(scope, &client_id),
        kind: kind.as_str(),
        conversation_id,
        text: text.as_str().to_owned(),
        role: role.as_str(),
        category: None,
        valid_at: None,
        invalid_at,
        title: None,
        messages: None,
        surprise: None,
        start_at: None,
        end_at: None,
        stability: None,
        difficulty: None,
        last_reviewed_at: None,
        consolidated_at: None,
        created_at,
        simhash: derived.simhash,
        text_digest: derived.text_digest,
        tags: derived.tags,
        source_ids,
        metadata_confidence: derived.metadata_confidence,
        importance: derived.importance,
        pinned: raw.pinned,
        manually_saved: raw.manually_saved || raw.pinned,
        embedding_model: embedding.as_ref().map(|(_, model)| model.clone()),
        embedding: embedding.map(|(vector, _)| vector),
    };
    if kind == MemoryKind::Semantic {
        reject_episode_fields(field, raw)?;
        let category = category_from_proto(&format!("{field}.category"), raw.category)?
            .unwrap_or_else(|| importance::infer_category(text.as_str()));
        row.category = Some(Category::as_str(category));
        row.valid_at = Some(valid_at.unwrap_or(created_at));
    } else {
        if conversation_id.is_none() {
            return Err(ValidationError::new(
                format!("{field}.conversation_id"),
                "is required for an episode (the conversation it segments)",
            ));
        }
        let episode = parse_episode(field, raw, created_at, limits)?;
        row.valid_at = valid_at;
        row.title = Some(episode.title);
        row.messages = Some(episode.messages);
        row.surprise = Some(episode.surprise);
        row.start_at = Some(episode.start_at);
        row.end_at = Some(episode.end_at);
        row.stability = Some(episode.stability);
        row.difficulty = Some(episode.difficulty);
        row.last_reviewed_at = Some(episode.last_reviewed_at);
        // An episode arrives as it is, with whatever facts its store already derived (imported
        // beside it): consolidation does not derive them a second time.
        row.consolidated_at = Some(limits.now);
    }
    Ok(ParsedImport { client_id, row })
}

/// Validates a whole request: every entry, and client ids unique within it.
pub fn parse_batch(
    scope: &Scope,
    entries: &[v1::ImportedMemory],
    context_turns: Option<u32>,
    limits: &ImportLimits,
) -> Result<Vec<ParsedImport>, ValidationError> {
    if let Some(context_turns) = context_turns
        && context_turns > MAX_CONTEXT_TURNS
    {
        return Err(ValidationError::new(
            "context_turns",
            format!("must be 0 to {MAX_CONTEXT_TURNS}, got {context_turns}"),
        ));
    }
    if entries.is_empty() {
        return Err(ValidationError::new(
            "memories",
            "must hold at least one entry",
        ));
    }
    if entries.len() > MAX_IMPORT_BATCH {
        return Err(ValidationError::new(
            "memories",
            format!(
                "has {} entries; send at most {MAX_IMPORT_BATCH} per request",
                entries.len()
            ),
        ));
    }
    let mut seen = HashSet::with_capacity(entries.len());
    entries
        .iter()
        .enumerate()
        .map(|(index, raw)| {
            let field = format!("memories[{index}]");
            let parsed = parse_entry(&field, scope, raw, limits)?;
            if !seen.insert(parsed.client_id.clone()) {
                return Err(ValidationError::new(
                    format!("{field}.client_id"),
                    format!("{:?} appears twice in this request", parsed.client_id),
                ));
            }
            Ok(parsed)
        })
        .collect()
}

/// The neighbours each fact of an import is searched with: what the request asked for or, when
/// it did not say, `DIALOG_CONTEXT_TURNS` for facts that read as a dialog ("Maria: ...",
/// "Ana: ...": `speaker::reads_as_dialog`) and none for anything else, where a neighbour is
/// just another fact.
pub fn context_turns(requested: Option<u32>, entries: &[ParsedImport]) -> u32 {
    requested.unwrap_or_else(|| {
        let facts = entries
            .iter()
            .filter(|entry| entry.row.kind == MemoryKind::Semantic.as_str())
            .map(|entry| entry.row.text.as_str());
        if engram_core::speaker::reads_as_dialog(facts) {
            DIALOG_CONTEXT_TURNS
        } else {
            0
        }
    })
}

/// The search context of each imported fact: the text of up to `turns` facts before and after
/// it among `rows` — the same conversation (or none), in time order (the request's order among
/// equal times), within [`CONTEXT_WINDOW`] of it. A chat history imported one turn per fact is
/// then searched turn by turn with what was said around each. `rows` must hold only what is
/// stored: a forgotten or incognito turn's words must not live on in its neighbours' context.
fn neighbour_contexts(rows: &[&ImportRow], turns: usize) -> Vec<(Uuid, String)> {
    if turns == 0 {
        return Vec::new();
    }
    let mut order: Vec<&ImportRow> = rows
        .iter()
        .copied()
        .filter(|row| row.kind == MemoryKind::Semantic.as_str())
        .collect();
    // Stable: entries of the same time keep the request's order.
    order.sort_by_key(|row| (row.conversation_id, row.created_at));
    order
        .iter()
        .enumerate()
        .filter_map(|(position, row)| {
            let near = |other: &&&ImportRow| {
                other.conversation_id == row.conversation_id
                    && (other.created_at - row.created_at).abs() <= CONTEXT_WINDOW
            };
            let before = &order[position.saturating_sub(turns)..position];
            let after = &order[position + 1..(position + 1 + turns).min(order.len())];
            let context: Vec<&str> = before
                .iter()
                .chain(after)
                .filter(near)
                .map(|other| other.text.as_str())
                .collect();
            (!context.is_empty()).then(|| (row.id, context.join("\n")))
        })
        .collect()
}

/// One imported entry in the response.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedEntry {
    pub client_id: String,
    pub id: Uuid,
    pub created: bool,
    /// The user forgot this memory (a live tombstone matches it): not stored.
    pub suppressed_by_tombstone: bool,
    /// Its conversation is incognito: not stored.
    pub skipped_incognito: bool,
}

impl MemoryWriter {
    /// Imports a validated batch in one transaction. Memory off refuses (FailedPrecondition).
    #[tracing::instrument(skip_all, fields(user_id = %scope.user_id, space = %scope.space, entries = entries.len()), err(Display))]
    pub async fn import(
        &self,
        scope: &Scope,
        entries: Vec<ParsedImport>,
        context_turns: u32,
    ) -> Result<Vec<ImportedEntry>, IngestError> {
        let context = engram_store::retrieval::context(&self.pool, scope, None).await?;
        if !context.memory_enabled {
            return Err(IngestError::FailedPrecondition(
                "memory is turned off for this space; turn it on before importing".into(),
            ));
        }
        let mut transaction = engram_store::begin(&self.pool).await?;
        // Nothing from an incognito conversation is kept, whichever way it arrives.
        let conversations: Vec<Uuid> = entries
            .iter()
            .filter_map(|entry| entry.row.conversation_id)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let incognito: HashSet<Uuid> =
            conversations::incognito_among(&mut transaction, scope, &conversations)
                .await?
                .into_iter()
                .collect();
        let is_incognito = |row: &ImportRow| {
            row.conversation_id
                .is_some_and(|conversation| incognito.contains(&conversation))
        };
        let rows: Vec<ImportRow> = entries
            .iter()
            .map(|entry| &entry.row)
            .filter(|row| !is_incognito(row))
            .cloned()
            .collect();
        // An import of nothing but incognito entries leaves no trace at all, not even its audit.
        let (inserted, suppressed): (HashSet<Uuid>, HashSet<Uuid>) = if rows.is_empty() {
            transaction.rollback().await?;
            Default::default()
        } else {
            let outcome = transfer::import(&mut transaction, scope, &rows).await?;
            let inserted: HashSet<Uuid> = outcome.inserted.into_iter().collect();
            let suppressed: HashSet<Uuid> = outcome.suppressed.into_iter().collect();
            // Contexts only from what is stored: a turn a tombstone suppressed is nobody's
            // context. Set on the new rows only (an import is idempotent by client id).
            let stored: Vec<&ImportRow> = rows
                .iter()
                .filter(|row| !suppressed.contains(&row.id))
                .collect();
            let contexts: Vec<(Uuid, String)> = neighbour_contexts(&stored, context_turns as usize)
                .into_iter()
                .filter(|(id, _)| inserted.contains(id))
                .collect();
            transfer::set_search_contexts(&mut transaction, scope, &contexts).await?;
            // From here the write may land even if the caller stops waiting.
            mark_write_started();
            transaction.commit().await?;
            (inserted, suppressed)
        };
        if rows
            .iter()
            .any(|row| row.embedding.is_none() && inserted.contains(&row.id))
            && let Some(wake) = &self.hooks.sweep_wake
        {
            // Imports announce nothing on the bus; the backfill's sweep embeds them.
            wake.notify_one();
        }
        Ok(entries
            .into_iter()
            .map(|entry| ImportedEntry {
                created: inserted.contains(&entry.row.id),
                suppressed_by_tombstone: suppressed.contains(&entry.row.id),
                skipped_incognito: is_incognito(&entry.row),
                id: entry.row.id,
                client_id: entry.client_id,
            })
            .collect())
    }

    /// The limits a batch is validated against.
    pub async fn import_limits(&self) -> Result<ImportLimits, IngestError> {
        let dimension = engram_store::embeddings::stored_dimension(&self.pool).await?;
        Ok(ImportLimits {
            max_text_chars: self.settings.max_text_chars,
            embedding_model: self.hooks.embedding_model.clone(),
            dimension,
            now: Utc::now(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> Scope {
        Scope::parse("scope", "7b7e3f5e-64d4-4c8b-a3f3-0d0f1f8f6a11", "work").unwrap()
    }

    fn limits() -> ImportLimits {
        ImportLimits {
            max_text_chars: 8_192,
            embedding_model: Some("all-MiniLM-L6-v2".to_owned()),
            dimension: 4,
            now: Utc::now(),
        }
    }

    fn fact(client_id: &str, text: &str) -> v1::ImportedMemory {
        v1::ImportedMemory {
            client_id: client_id.into(),
            kind: v1::MemoryKind::Semantic.into(),
            text: text.into(),
            ..Default::default()
        }
    }

    #[test]
    fn ids_are_stable_per_scope_and_client_id() {
        let scope = scope();
        let other = Scope::parse("scope", "7b7e3f5e-64d4-4c8b-a3f3-0d0f1f8f6a11", "home").unwrap();
        assert_eq!(import_id(&scope, "a"), import_id(&scope, "a"));
        assert_ne!(import_id(&scope, "a"), import_id(&scope, "b"));
        assert_ne!(import_id(&scope, "a"), import_id(&other, "a"));
    }

    #[test]
    fn a_fact_gets_what_remember_would_derive() {
        let parsed = parse_entry(
            "m",
            &scope(),
            &fact("1", "I prefer dark mode in every editor"),
            &limits(),
        )
        .unwrap();
        assert_eq!(parsed.row.kind, MemoryKind::Semantic.as_str());
        assert_eq!(parsed.row.category, Some("preference"));
        assert!(parsed.row.valid_at.is_some());
        assert!(parsed.row.importance > 0.5, "{}", parsed.row.importance);
    }

    #[test]
    fn an_episode_needs_a_title_and_a_conversation_and_gets_an_initial_fsrs_state() {
        let mut raw = v1::ImportedMemory {
            client_id: "e".into(),
            kind: v1::MemoryKind::Episodic.into(),
            text: "We planned the launch".into(),
            ..Default::default()
        };
        let error = parse_entry("m", &scope(), &raw, &limits()).unwrap_err();
        assert!(error.to_string().contains("m.conversation_id"), "{error}");
        raw.conversation_id = Uuid::new_v4().to_string();
        let error = parse_entry("m", &scope(), &raw, &limits()).unwrap_err();
        assert!(error.to_string().contains("m.title"), "{error}");
        raw.title = "Launch".into();
        raw.surprise = Some(1.0);
        let parsed = parse_entry("m", &scope(), &raw, &limits()).unwrap();
        let (stability, _) = initial_state(1.0);
        assert_eq!(parsed.row.stability, Some(stability));
        assert_eq!(parsed.row.category, None);
    }

    #[test]
    fn bad_entries_name_the_field() {
        let mut raw = fact("1", "text");
        raw.importance = Some(1.5);
        assert!(
            parse_entry("m", &scope(), &raw, &limits())
                .unwrap_err()
                .to_string()
                .contains("m.importance")
        );
        let mut raw = fact("1", "text");
        raw.surprise = Some(0.5);
        assert!(
            parse_entry("m", &scope(), &raw, &limits())
                .unwrap_err()
                .to_string()
                .contains("episodes only")
        );
        let mut raw = fact("1", "text");
        raw.embedding = vec![0.1; 4];
        raw.embedding_model = "other-model".into();
        assert!(
            parse_entry("m", &scope(), &raw, &limits())
                .unwrap_err()
                .to_string()
                .contains("embeds with")
        );
        raw.embedding_model = "all-MiniLM-L6-v2".into();
        raw.embedding = vec![0.1; 3];
        assert!(
            parse_entry("m", &scope(), &raw, &limits())
                .unwrap_err()
                .to_string()
                .contains("3 dimensions")
        );
        let error =
            parse_batch(&scope(), &[fact("x", "a"), fact("x", "b")], None, &limits()).unwrap_err();
        assert!(error.to_string().contains("appears twice"), "{error}");
        assert!(parse_batch(&scope(), &[], None, &limits()).is_err());
        let error = parse_batch(&scope(), &[fact("x", "a")], Some(6), &limits()).unwrap_err();
        assert_eq!(error.to_string(), "context_turns: must be 0 to 5, got 6");
    }

    #[test]
    fn turns_are_searched_with_their_neighbours_in_time_and_conversation() {
        let at = |minutes: i64| {
            Some(engram_server::time::to_proto(
                Utc::now() - chrono::Duration::days(1) + chrono::Duration::minutes(minutes),
            ))
        };
        let turn = |id: &str, text: &str, minutes: i64| v1::ImportedMemory {
            created_at: at(minutes),
            ..fact(id, text)
        };
        let other_chat = v1::ImportedMemory {
            conversation_id: Uuid::new_v4().to_string(),
            ..turn("other", "A different chat", 2)
        };
        let turns = [
            turn("a", "We adopted two dogs", 0),
            turn("b", "Meet Toby, our pup", 1),
            other_chat,
            turn("c", "Yes, last week!", 2),
            turn("d", "Hours later: the weather", 200),
        ];
        let parsed = parse_batch(&scope(), &turns, Some(1), &limits()).unwrap();
        let rows: Vec<&ImportRow> = parsed.iter().map(|p| &p.row).collect();
        let contexts = neighbour_contexts(&rows, 1);
        let context = |id: &str| {
            let row = &parsed.iter().find(|p| p.client_id == id).unwrap().row;
            contexts
                .iter()
                .find(|(of, _)| *of == row.id)
                .map(|(_, context)| context.as_str())
        };
        assert_eq!(context("a"), Some("Meet Toby, our pup"));
        assert_eq!(context("b"), Some("We adopted two dogs\nYes, last week!"));
        assert_eq!(context("c"), Some("Meet Toby, our pup"));
        assert_eq!(context("d"), None, "hours apart: another sitting");
        assert_eq!(context("other"), None, "another conversation");
        assert!(neighbour_contexts(&rows, 0).is_empty());
        // What is not stored is nobody's context: without "b", "a" and "c" are neighbours.
        let without_b: Vec<&ImportRow> = rows
            .iter()
            .copied()
            .filter(|row| row.text != "Meet Toby, our pup")
            .collect();
        let contexts = neighbour_contexts(&without_b, 1);
        assert!(
            contexts
                .iter()
                .all(|(_, context)| !context.contains("Toby")),
            "{contexts:?}"
        );
    }

    #[test]
    fn a_dialog_is_searched_with_its_neighbours_unless_the_request_says_otherwise() {
        let parse = |texts: &[&str]| {
            let entries: Vec<v1::ImportedMemory> = texts
                .iter()
                .enumerate()
                .map(|(index, text)| fact(&index.to_string(), text))
                .collect();
            parse_batch(&scope(), &entries, None, &limits()).unwrap()
        };
        let dialog = parse(&[
            "Maria: Did you ever make it to Lisbon?",
            "Ana: Yes, last week!",
            "Maria: And?",
        ]);
        assert_eq!(context_turns(None, &dialog), DIALOG_CONTEXT_TURNS);
        assert_eq!(context_turns(Some(0), &dialog), 0);
        let facts = parse(&["I prefer dark mode", "My manager is Alice Chen"]);
        assert_eq!(context_turns(None, &facts), 0);
        assert_eq!(context_turns(Some(3), &facts), 3);
    }
}
