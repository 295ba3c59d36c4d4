//! The statements of the write path, shaped for group commit: each statement serves every write
//! of a batch at once (one per space), so a batch of N writes to N spaces costs the same few round
//! trips and statement executions as a single write. One query reads everything the writes decide
//! on (a near-duplicate's whole entry included, which a merge is computed from), one statement
//! applies the merges and inserts the new entries (audited), one enforces the soft cap of every
//! space that went over it.
//!
//! Rows are passed as arrays (`unnest`) or as one JSON document (`jsonb_to_recordset`) when they
//! carry arrays of their own (tags). Per-write lookups are written as LATERAL subqueries so that
//! they stay index probes under generic plans, whatever the planner guesses about the batch size.

use chrono::{DateTime, Utc};
use engram_core::capacity::MIN_DECAY_EXPONENT;
use engram_core::{ConversationId, RetentionPolicy, Scope, Scores, SimHash};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, Row as _};
use uuid::Uuid;

use crate::StoreError;
use crate::memories::{MemoryRecord, MergeUpdate, NewSemanticMemory};
use crate::outbox::NewOutboxEvent;

/// What a write needs to know about its space, its conversation and the text's near-duplicate,
/// read in one query (after the space lock is held, so it cannot change underneath).
#[derive(Debug, Clone, PartialEq)]
pub struct WriteContext {
    pub memory_enabled: bool,
    pub incognito_default: bool,
    pub soft_cap: Option<i32>,
    pub memory_count: i64,
    /// The conversation's explicit incognito state, if it has one.
    pub conversation_incognito: Option<bool>,
    /// Expiry of a live tombstone matching the text (same digest or SimHash within distance 3).
    pub tombstone_expires_at: Option<DateTime<Utc>>,
    /// The semantic memory this text would merge into (nearest within distance 3), if any: the
    /// whole entry, since the merge is computed from it.
    pub near_duplicate: Option<MemoryRecord>,
}

impl<'r> FromRow<'r, PgRow> for WriteContext {
    /// The context columns, and the near-duplicate's memory columns (all NULL when it has none).
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        let near_duplicate_id: Option<Uuid> = row.try_get("id")?;
        Ok(Self {
            memory_enabled: row.try_get("memory_enabled")?,
            incognito_default: row.try_get("incognito_default")?,
            soft_cap: row.try_get("soft_cap")?,
            memory_count: row.try_get("memory_count")?,
            conversation_incognito: row.try_get("conversation_incognito")?,
            tombstone_expires_at: row.try_get("tombstone_expires_at")?,
            near_duplicate: match near_duplicate_id {
                Some(_) => Some(MemoryRecord::from_row(row)?),
                None => None,
            },
        })
    }
}

/// One write's question to [`write_contexts`].
#[derive(Debug, Clone, Copy)]
pub struct ContextQuery<'a> {
    pub scope: &'a Scope,
    pub conversation: Option<ConversationId>,
    pub simhash: SimHash,
    pub text_digest: &'a [u8],
}

/// A row of a batch statement's answer, tagged with the 1-based position of the input it answers.
#[derive(sqlx::FromRow)]
struct Positioned<T> {
    position: i64,
    #[sqlx(flatten)]
    row: T,
}

/// The rows of a batch statement, one per input in input order, or an error naming the
/// statement if it answered anything else.
fn one_per_input<T>(
    rows: Vec<Positioned<T>>,
    inputs: usize,
    statement: &str,
) -> Result<Vec<T>, StoreError> {
    if rows.len() != inputs || rows.iter().zip(1..).any(|(row, at)| row.position != at) {
        return Err(StoreError::Corrupt(format!(
            "{statement} answered {} rows for {inputs} inputs",
            rows.len()
        )));
    }
    Ok(rows.into_iter().map(|row| row.row).collect())
}

/// The write context of every query, in the order given. The spaces must already be locked
/// ([`crate::begin_with_spaces_locked`]).
pub async fn write_contexts(
    connection: &mut PgConnection,
    queries: &[ContextQuery<'_>],
) -> Result<Vec<WriteContext>, StoreError> {
    let mut user_ids = Vec::with_capacity(queries.len());
    let mut spaces = Vec::with_capacity(queries.len());
    let mut conversations = Vec::with_capacity(queries.len());
    let mut simhashes = Vec::with_capacity(queries.len());
    let mut digests = Vec::with_capacity(queries.len());
    for query in queries {
        user_ids.push(query.scope.user_id.as_uuid());
        spaces.push(query.scope.space.as_str());
        conversations.push(query.conversation.map(|c| c.as_uuid()));
        simhashes.push(query.simhash.as_i64());
        digests.push(query.text_digest);
    }
    let rows = sqlx::query_as::<_, Positioned<WriteContext>>(concat!(
        "SELECT w.position, \
                COALESCE(s.memory_enabled, true) AS memory_enabled, \
                COALESCE(s.incognito_default, false) AS incognito_default, \
                s.soft_cap, \
                COALESCE(s.memory_count, 0) AS memory_count, \
                (SELECT c.incognito FROM conversations c \
                  WHERE c.user_id = w.user_id AND c.space = w.space \
                    AND c.conversation_id = w.conversation_id) AS conversation_incognito, \
                (SELECT max(t.expires_at) FROM tombstones t \
                  WHERE t.user_id = w.user_id AND t.space = w.space AND ",
        live_tombstone_matches!("w.simhash", "w.digest", "$6"),
        ") AS tombstone_expires_at, \
                duplicate.* \
         FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::int8[], $5::bytea[]) \
              WITH ORDINALITY AS w(user_id, space, conversation_id, simhash, digest, position) \
         LEFT JOIN spaces s ON s.user_id = w.user_id AND s.space = w.space \
         LEFT JOIN LATERAL (",
        near_duplicate_lookup!(memory_columns!(), "w.user_id", "w.space", "w.simhash", "$6"),
        ") AS duplicate ON true \
         ORDER BY w.position"
    ))
    .bind(&user_ids)
    .bind(&spaces)
    .bind(&conversations)
    .bind(&simhashes)
    .bind(&digests)
    .bind(i64::from(engram_core::simhash::NEAR_DUPLICATE_DISTANCE))
    .fetch_all(connection)
    .await?;
    one_per_input(rows, queries.len(), "the write context query")
}

/// A new semantic memory with what is written beside it in the same statement ([`write_entries`]).
#[derive(Debug, Clone)]
pub struct AuditedInsert<'a> {
    pub scope: &'a Scope,
    pub memory: &'a NewSemanticMemory,
    /// Detail of the `create` audit event.
    pub audit_detail: serde_json::Value,
    /// The outbox event announcing the entry (asks for its embedding), when the bus is on.
    pub event: Option<&'a NewOutboxEvent>,
}

/// One row of the insert document: the columns of `jsonb_to_recordset` in the statement below.
#[derive(Serialize)]
struct InsertRow<'a> {
    id: Uuid,
    user_id: Uuid,
    space: &'a str,
    conversation_id: Option<Uuid>,
    text: &'a str,
    role: &'a str,
    category: &'a str,
    simhash: i64,
    tags: &'a [String],
    source_ids: &'a [String],
    metadata_confidence: f64,
    importance: f64,
    pinned: bool,
    manually_saved: bool,
    last_scores: &'a Scores,
    source_episode_ids: &'a [Uuid],
    fact_subject: Option<&'a str>,
    fact_value: Option<&'a str>,
    valid_at: Option<DateTime<Utc>>,
    audit_detail: &'a serde_json::Value,
    event_message_id: Option<Uuid>,
    event_routing_key: Option<&'a str>,
    event_type_name: Option<&'a str>,
    /// Hex; the statement decodes it.
    event_payload: Option<String>,
    event_trace_headers: Option<serde_json::Value>,
}

/// Bytes as lowercase hex, for JSON documents the statements `decode(..., 'hex')`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut hex = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// Rows as one JSON document, for `jsonb_to_recordset`.
fn json_document<T: Serialize>(rows: &[T], what: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(rows)
        .map_err(|error| StoreError::Corrupt(format!("cannot encode {what}: {error}")))
}

/// The rows of the insert document.
fn insert_rows<'a>(inserts: &'a [AuditedInsert<'a>]) -> Vec<InsertRow<'a>> {
    inserts
        .iter()
        .map(|insert| {
            let memory = insert.memory;
            InsertRow {
                id: memory.id,
                user_id: insert.scope.user_id.as_uuid(),
                space: insert.scope.space.as_str(),
                conversation_id: memory.conversation_id,
                text: &memory.text,
                role: memory.role,
                category: memory.category,
                simhash: memory.simhash.as_i64(),
                tags: &memory.tags,
                source_ids: &memory.source_ids,
                metadata_confidence: memory.metadata_confidence,
                importance: memory.importance,
                pinned: memory.pinned,
                manually_saved: memory.manually_saved,
                last_scores: &memory.last_scores,
                source_episode_ids: &memory.source_episode_ids,
                fact_subject: memory.fact_subject.as_deref(),
                fact_value: memory.fact_value.as_deref(),
                valid_at: memory.valid_at,
                audit_detail: &insert.audit_detail,
                event_message_id: insert.event.map(|e| e.message_id),
                event_routing_key: insert.event.map(|e| e.routing_key.as_str()),
                event_type_name: insert.event.map(|e| e.type_name.as_str()),
                event_payload: insert.event.map(|e| hex(&e.payload)),
                event_trace_headers: insert.event.map(NewOutboxEvent::trace_headers_json),
            }
        })
        .collect()
}

/// A near-duplicate write folded into its canonical entry, with the audit event it leaves
/// ([`write_entries`]).
#[derive(Debug, Clone)]
pub struct AuditedMerge<'a> {
    pub scope: &'a Scope,
    pub id: Uuid,
    pub update: &'a MergeUpdate,
    pub conversation: Option<ConversationId>,
    /// Detail of the `merge` audit event.
    pub audit_detail: serde_json::Value,
    /// The merge pins an entry that was not pinned (an explicit pin request on a repeat): it is
    /// audited as a `pin` too, so that every pin shows in the audit trail.
    pub pins: bool,
}

#[derive(Serialize)]
struct MergeRow<'a> {
    id: Uuid,
    user_id: Uuid,
    space: &'a str,
    repeat_count: i32,
    importance: f64,
    manually_saved: bool,
    pinned: bool,
    tags: &'a [String],
    source_ids: &'a [String],
    metadata_confidence: f64,
    last_scores: &'a Scores,
    source_episode_ids: &'a [Uuid],
    conversation_id: Option<Uuid>,
    audit_detail: &'a serde_json::Value,
    pins: bool,
}

/// What [`write_entries`] wrote: the merged and the created records, each in the order given.
#[derive(Debug, Default)]
pub struct WrittenEntries {
    pub merged: Vec<MemoryRecord>,
    pub created: Vec<MemoryRecord>,
}

/// A row of [`write_entries`]' answer.
#[derive(sqlx::FromRow)]
struct WrittenRow {
    created: bool,
    #[sqlx(flatten)]
    record: MemoryRecord,
}

/// Applies merges (each with its `merge` audit event) and inserts new semantic memories (each with
/// its `create` audit event and, when given, the outbox event that asks for its embedding), in one
/// statement: one round trip for both. They cannot interfere: a merge rewrites an entry that
/// existed before the statement, an insert adds a new one, and each entry is merged at most once.
/// A round with only merges or only inserts runs only that half. Returns the merged and the
/// created records, each in the order given.
pub async fn write_entries(
    connection: &mut PgConnection,
    merges: &[AuditedMerge<'_>],
    inserts: &[AuditedInsert<'_>],
) -> Result<WrittenEntries, StoreError> {
    if merges.is_empty() && inserts.is_empty() {
        return Ok(WrittenEntries::default());
    }
    // Only the parts a round needs: a part without rows would still fire the statement triggers
    // of its table.
    let sql = match (merges.is_empty(), inserts.is_empty()) {
        (false, false) => concat!(
            "WITH ",
            include_str!("write_path/merge_entries.sql"),
            ", ",
            include_str!("write_path/insert_entries.sql"),
            " SELECT false AS created, ",
            memory_columns!(),
            " FROM updated UNION ALL SELECT true, ",
            memory_columns!(),
            " FROM inserted"
        ),
        (false, true) => concat!(
            "WITH ",
            include_str!("write_path/merge_entries.sql"),
            " SELECT false AS created, ",
            memory_columns!(),
            " FROM updated"
        ),
        (true, _) => concat!(
            "WITH ",
            include_str!("write_path/insert_entries.sql"),
            " SELECT true AS created, ",
            memory_columns!(),
            " FROM inserted"
        ),
    };
    // The merges are always $1 and the new memories $2; a half the round leaves out is bound
    // as NULL and not read.
    let merge_document = (!merges.is_empty())
        .then(|| json_document(&merge_rows(merges), "merges"))
        .transpose()?;
    let insert_document = (!inserts.is_empty())
        .then(|| json_document(&insert_rows(inserts), "new memories"))
        .transpose()?;
    let rows = sqlx::query_as::<_, WrittenRow>(sql)
        .bind(merge_document)
        .bind(insert_document)
        .fetch_all(connection)
        .await?;
    let (created, merged): (Vec<WrittenRow>, Vec<WrittenRow>) =
        rows.into_iter().partition(|row| row.created);
    Ok(WrittenEntries {
        merged: in_given_order(
            merged.into_iter().map(|row| row.record).collect(),
            merges.iter().map(|merge| merge.id),
        )?,
        created: in_given_order(
            created.into_iter().map(|row| row.record).collect(),
            inserts.iter().map(|insert| insert.memory.id),
        )?,
    })
}

/// The rows of the merge document.
fn merge_rows<'a>(merges: &'a [AuditedMerge<'a>]) -> Vec<MergeRow<'a>> {
    merges
        .iter()
        .map(|merge| MergeRow {
            id: merge.id,
            user_id: merge.scope.user_id.as_uuid(),
            space: merge.scope.space.as_str(),
            repeat_count: merge.update.repeat_count,
            importance: merge.update.importance,
            manually_saved: merge.update.manually_saved,
            pinned: merge.update.pinned,
            tags: &merge.update.tags,
            source_ids: &merge.update.source_ids,
            metadata_confidence: merge.update.metadata_confidence,
            last_scores: &merge.update.last_scores,
            source_episode_ids: &merge.update.source_episode_ids,
            conversation_id: merge.conversation.map(|c| c.as_uuid()),
            audit_detail: &merge.audit_detail,
            pins: merge.pins,
        })
        .collect()
}

/// `records` reordered to follow `ids`; an id without its record means the statement did not
/// write what it was asked to.
fn in_given_order(
    mut records: Vec<MemoryRecord>,
    ids: impl ExactSizeIterator<Item = Uuid>,
) -> Result<Vec<MemoryRecord>, StoreError> {
    let expected = ids.len();
    let mut ordered = Vec::with_capacity(expected);
    for id in ids {
        let at = records
            .iter()
            .position(|record| record.id == id)
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "memory {id} was not written by its batch statement"
                ))
            })?;
        ordered.push(records.swap_remove(at));
    }
    Ok(ordered)
}

/// A space over its soft cap, and by how many entries.
#[derive(Debug, Clone, Copy)]
pub struct CapacityTarget<'a> {
    pub scope: &'a Scope,
    pub overage: i64,
}

/// The outcome of enforcing the soft cap of one space.
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct TrimOutcome {
    /// Deleted entries, lowest total first.
    pub trimmed: Vec<Uuid>,
    /// Pinned or saved entries that ranked among the lowest `overage` totals (alerts).
    pub protected_would_be_victims: Vec<Uuid>,
}

/// Enforces the soft cap of every target space in one statement: the capacity policy of
/// [`engram_core::capacity::plan_trim`] (the reference, which a test holds this SQL to), run
/// where the rows are so that a write at the cap does not ship the whole space to the service.
/// Returns one outcome per target, in the order given; each space appears at most once.
///
/// Cached totals are used while fresh; missing or stale ones are recomputed as
/// recency exp(−Δt/τ) + importance (relevance 0) and cached (exp is not called below
/// [`MIN_DECAY_EXPONENT`], where Postgres would raise an underflow error for old entries); the `overage` lowest totals among
/// entries that are neither pinned nor manually saved are deleted and audited as trims.
///
/// Only the entries that can matter are read, each set through an index of the narrow
/// `memory_retention` table (kept in step with `memories` by triggers): all entries with a missing
/// or stale cache (recomputed), and the `overage` lowest fresh totals of trimmable and of
/// protected entries. The lowest `overage` entries of the whole space are among them, so the
/// ranking is the reference's, at a cost that does not grow with the space.
pub async fn enforce_soft_caps(
    connection: &mut PgConnection,
    targets: &[CapacityTarget<'_>],
    policy: &RetentionPolicy,
) -> Result<Vec<TrimOutcome>, StoreError> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let tau_secs = policy.recency_tau.num_milliseconds() as f64 / 1000.0;
    let staleness_secs = policy.score_staleness.num_milliseconds() as f64 / 1000.0;
    let user_ids: Vec<Uuid> = targets.iter().map(|t| t.scope.user_id.as_uuid()).collect();
    let spaces: Vec<&str> = targets.iter().map(|t| t.scope.space.as_str()).collect();
    let overages: Vec<i64> = targets.iter().map(|t| t.overage).collect();
    // `OFFSET 0` keeps each space's lookups as LATERAL index probes: pulled up into a join, a
    // generic plan may guess a large batch and scan the table instead.
    let rows = sqlx::query_as::<_, Positioned<TrimOutcome>>(include_str!(
        "write_path/trim_to_soft_cap.sql"
    ))
    .bind(&user_ids)
    .bind(&spaces)
    .bind(&overages)
    .bind(tau_secs)
    .bind(staleness_secs)
    .bind(MIN_DECAY_EXPONENT)
    .fetch_all(connection)
    .await?;
    one_per_input(rows, targets.len(), "the soft cap statement")
}

/// A new fact that states a value of a subject: older valid facts of the subject with another
/// value are superseded by it.
#[derive(Debug, Clone, Copy)]
pub struct Superseding<'a> {
    pub scope: &'a Scope,
    pub new_fact: Uuid,
    pub subject: &'a str,
    pub value: &'a str,
    pub conversation: Option<ConversationId>,
}

/// Sets `invalid_at` (and `superseded_by`) on the older valid facts each new fact contradicts:
/// same subject, another value. They stay, as history; each is audited as `supersede`. Returns
/// (superseded, by) pairs. An older fact stops being true when the new one was said (its
/// `valid_at`; now when that is unknown), not when it was written; a fact said after the new one
/// (a history imported out of order, or a later session consolidated first) is not superseded
/// by it: the new one is written as superseded by that later fact instead.
pub async fn supersede_facts(
    connection: &mut PgConnection,
    facts: &[Superseding<'_>],
) -> Result<Vec<(Uuid, Uuid)>, StoreError> {
    if facts.is_empty() {
        return Ok(Vec::new());
    }
    let users: Vec<Uuid> = facts.iter().map(|f| f.scope.user_id.as_uuid()).collect();
    let spaces: Vec<&str> = facts.iter().map(|f| f.scope.space.as_str()).collect();
    let new_facts: Vec<Uuid> = facts.iter().map(|f| f.new_fact).collect();
    let subjects: Vec<&str> = facts.iter().map(|f| f.subject).collect();
    let values: Vec<&str> = facts.iter().map(|f| f.value).collect();
    let conversations: Vec<Option<Uuid>> = facts
        .iter()
        .map(|f| f.conversation.map(|c| c.as_uuid()))
        .collect();
    let pairs = sqlx::query_as(include_str!("write_path/supersede_facts.sql"))
        .bind(&users)
        .bind(&spaces)
        .bind(&new_facts)
        .bind(&subjects)
        .bind(&values)
        .bind(&conversations)
        .fetch_all(connection)
        .await?;
    Ok(pairs)
}

/// Supersedes facts judged contradicted by newer ones (by an LLM, or by the rule that a thing
/// said to be over ends the facts naming it): `(older, newer)` pairs of the space. Only valid
/// facts said no later than the newer one change, each from when the newer one was said (as
/// [`supersede_facts`]); each is audited as `supersede` with who judged it. Returns the pairs
/// applied.
pub async fn supersede_judged(
    connection: &mut PgConnection,
    scope: &Scope,
    pairs: &[(Uuid, Uuid)],
    judged_by: &str,
) -> Result<Vec<(Uuid, Uuid)>, StoreError> {
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let older: Vec<Uuid> = pairs.iter().map(|(old, _)| *old).collect();
    let newer: Vec<Uuid> = pairs.iter().map(|(_, new)| *new).collect();
    let applied = sqlx::query_as(
        "WITH judged AS (SELECT * FROM unnest($3::uuid[], $4::uuid[]) AS j(older, newer)), \
         superseded AS ( \
             UPDATE memories m SET invalid_at = COALESCE(n.valid_at, now()), superseded_by = j.newer, \
                 updated_at = now() \
             FROM judged j \
             JOIN memories n ON n.user_id = $1 AND n.space = $2 AND n.id = j.newer AND n.invalid_at IS NULL \
             WHERE m.user_id = $1 AND m.space = $2 AND m.id = j.older AND m.kind = 'semantic' \
               AND m.invalid_at IS NULL AND m.id <> j.newer \
               AND COALESCE(m.valid_at, m.created_at) <= COALESCE(n.valid_at, now()) \
             RETURNING m.id, j.newer, m.conversation_id), \
         audited AS ( \
             INSERT INTO audit_events (user_id, space, action, memory_id, conversation_id, detail) \
             SELECT $1, $2, 'supersede', id, conversation_id, \
                    jsonb_build_object('superseded_by', newer, 'judged_by', $5::text) \
             FROM superseded) \
         SELECT id, newer FROM superseded",
    )
    .bind(scope.user_id.as_uuid())
    .bind(scope.space.as_str())
    .bind(&older)
    .bind(&newer)
    .bind(judged_by)
    .fetch_all(connection)
    .await?;
    Ok(applied)
}
