//! Consolidation: the facts an episode established become semantic memories.
//!
//! The facts are the episode's structured summary (written by the LLM, or by the extractive
//! rules): its facts, preferences, decisions, todos and goals, each with its category. Each goes
//! through the normal write path as a Remember from the episode's conversation, so tombstones,
//! memory off and incognito are honoured, a fact said in several episodes merges into one entry
//! that lists every episode (`source_episode_ids`, repeat_count raised), and a fact stating a new
//! value of a subject supersedes the older one (and, with an LLM, the LLM is asked which earlier
//! facts the new ones make no longer true). `consolidated_at` is set once every fact is
//! written; running it again for the same episode changes nothing (a fact whose entry already
//! lists the episode is left as it is).

use chrono::{DateTime, Duration, Utc};
use engram_core::episode::StructuredSummary;
use engram_core::{ConversationId, MemoryKind, MemoryText, Scope, conflict, metadata};
use engram_store::retrieval::{self, Bm25, SearchFilter};
use engram_store::{memories, segments, write_path};
use uuid::Uuid;

use std::sync::Arc;

use engram_llm::ChatClient;
use sqlx::PgPool;

use super::llm::judge_conflicts;
use crate::error::IngestError;
use crate::metrics::IngestMetrics;
use crate::write_path::{MemoryWriter, RememberCommand, RememberResult};

/// Keywords kept with a consolidated fact.
const MAX_FACT_KEYWORDS: usize = 8;
/// Episodes left unconsolidated this long (a crash, a failure) are taken by the sweep.
const LEFTOVER_AGE: Duration = Duration::seconds(10);
/// Earlier facts looked up per new fact for the LLM's conflict check, and in all.
const CANDIDATES_PER_FACT: i64 = 4;
const MAX_CONFLICT_CANDIDATES: usize = 16;
/// Okapi BM25's usual parameters, for the conflict check's lookup.
const CONFLICT_BM25: Bm25 = Bm25 { k1: 1.2, b: 0.75 };
/// Older facts naming a thing a new fact says is over, looked at per thing.
const ENDED_CANDIDATES: i64 = 20;
/// Facts said after a segment's first new fact looked at for endings of what it names: in order
/// consolidation none, or the segment's own.
const LATER_CANDIDATES: i64 = 50;
/// Episodes one sweep consolidates, at most.
const LEFTOVERS_PER_SWEEP: i64 = 50;

/// Turns episodes into facts: what segmentation calls once an episode is written, and what its
/// sweep calls for episodes a failure left unconsolidated. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Consolidator {
    pub(crate) pool: PgPool,
    pub(crate) writer: MemoryWriter,
    pub(crate) llm: Option<ChatClient>,
    pub(crate) metrics: Arc<IngestMetrics>,
}

impl Consolidator {
    /// Writes the facts of an episode and marks it consolidated; returns how many facts were
    /// written or merged. An episode gone or consolidated already is left alone.
    pub(crate) async fn consolidate_episode(
        &self,
        scope: &Scope,
        episode_id: Uuid,
    ) -> Result<usize, IngestError> {
        let mut connection = self.pool.acquire().await?;
        let Some(episode) = memories::get(&mut connection, scope, episode_id).await? else {
            return Ok(0);
        };
        drop(connection);
        if episode.consolidated_at.is_some() {
            return Ok(0);
        }
        let summary: StructuredSummary = episode
            .structured_summary
            .clone()
            .and_then(|stored| serde_json::from_value(stored).ok())
            .unwrap_or_default();
        let conversation = episode.conversation_id.map(ConversationId::from_uuid);
        let max_chars = self.writer.settings.max_text_chars;
        let mut written = 0;
        let mut created: Vec<(Uuid, String)> = Vec::new();
        let mut earliest_said: Option<DateTime<Utc>> = None;
        for (text_said, category) in summary.established() {
            let Ok(text) = MemoryText::parse("fact", &text_said, max_chars) else {
                continue;
            };
            let keywords: Vec<String> = metadata::extract(text.as_str())
                .tags
                .into_iter()
                .take(MAX_FACT_KEYWORDS)
                .collect();
            let result = self
                .writer
                .remember(RememberCommand {
                    category: Some(category),
                    tags: keywords,
                    conversation,
                    source_episode: Some(episode.id),
                    // From when it was said; the episode's end where the describer did not say.
                    valid_at: summary.said_at.get(&text_said).copied().or(episode.end_at),
                    ..RememberCommand::plain(scope.clone(), text)
                })
                .await?;
            match result {
                RememberResult::Created { memory, .. } => {
                    written += 1;
                    if let Some(said) = memory.valid_at {
                        earliest_said = Some(earliest_said.map_or(said, |first| first.min(said)));
                    }
                    created.push((memory.id, memory.text));
                }
                RememberResult::Merged { .. } => written += 1,
                _ => {}
            }
        }
        self.supersede_ended(scope, &created, earliest_said).await?;
        if let Some(llm) = &self.llm
            && !created.is_empty()
        {
            self.judge_conflicts(llm, scope, &created).await;
        }
        if segments::mark_consolidated(&self.pool, scope, episode.id).await? {
            self.metrics.record_facts_derived(written as u64);
            tracing::info!(episode = %episode.id, facts = written, "episode consolidated");
        }
        Ok(written)
    }

    /// The rules' second kind of conflict (the first, a new value of a subject, is the write
    /// path's): a new fact saying something of its speaker's is over ("I gave up the cello",
    /// "We had to put Rex down") supersedes the valid older facts of the same speaker that name
    /// it ("I'm learning the cello"), each from when the new one was said. Whichever is written
    /// first: a new fact naming what a fact said after it ended (a later session consolidated
    /// first) is superseded by that one. `earliest_said`: when the first of the new facts was
    /// said.
    async fn supersede_ended(
        &self,
        scope: &Scope,
        created: &[(Uuid, String)],
        earliest_said: Option<DateTime<Utc>>,
    ) -> Result<(), IngestError> {
        let mut pairs: Vec<(Uuid, Uuid)> = Vec::new();
        for (new_fact, text) in created {
            for ended in conflict::ended_things(text) {
                let candidates =
                    segments::valid_facts_naming(&self.pool, scope, &ended.thing, ENDED_CANDIDATES)
                        .await?;
                for (older, older_text) in candidates {
                    let is_new = created.iter().any(|(id, _)| *id == older);
                    if !is_new
                        && conflict::names(&older_text, &ended)
                        && !pairs.iter().any(|(known, _)| *known == older)
                    {
                        pairs.push((older, *new_fact));
                    }
                }
            }
        }
        if let Some(earliest) = earliest_said {
            let later =
                segments::valid_facts_said_after(&self.pool, scope, earliest, LATER_CANDIDATES)
                    .await?;
            for (newer, newer_text) in &later {
                if created.iter().any(|(id, _)| id == newer) {
                    continue;
                }
                for ended in conflict::ended_things(newer_text) {
                    for (fact, text) in created {
                        if conflict::names(text, &ended)
                            && !pairs.iter().any(|(known, _)| known == fact)
                        {
                            // (supersede_judged leaves it alone if it was said after `newer`.)
                            pairs.push((*fact, *newer));
                        }
                    }
                }
            }
        }
        if pairs.is_empty() {
            return Ok(());
        }
        let mut connection = self.pool.acquire().await?;
        let applied = write_path::supersede_judged(&mut connection, scope, &pairs, "rules").await?;
        self.metrics.record_facts_superseded(applied.len() as u64);
        Ok(())
    }

    /// With an LLM: asks which earlier facts the new ones make no longer true (beyond what the
    /// subject rules of the write path caught), and supersedes them. A failure leaves the facts
    /// as the rules left them (said in the log and counted): nothing is guessed.
    async fn judge_conflicts(
        &self,
        llm: &engram_llm::ChatClient,
        scope: &Scope,
        created: &[(Uuid, String)],
    ) {
        let new_ids: Vec<Uuid> = created.iter().map(|(id, _)| *id).collect();
        let filter = SearchFilter {
            scope,
            kind: MemoryKind::Semantic,
            conversation: None,
            category: None,
            // A fact that still exists can be contradicted, active or not.
            include_inactive: true,
        };
        let mut candidate_ids: Vec<Uuid> = Vec::new();
        for (_, text) in created {
            let hits = match retrieval::sparse_search(
                &self.pool,
                &filter,
                text,
                CONFLICT_BM25,
                CANDIDATES_PER_FACT,
            )
            .await
            {
                Ok(hits) => hits,
                Err(error) => {
                    tracing::warn!(%error, "cannot look up earlier facts for the conflict check");
                    return;
                }
            };
            for (id, _) in hits {
                if !new_ids.contains(&id) && !candidate_ids.contains(&id) {
                    candidate_ids.push(id);
                }
            }
        }
        candidate_ids.truncate(MAX_CONFLICT_CANDIDATES);
        if candidate_ids.is_empty() {
            return;
        }
        let earlier = match segments::valid_fact_texts(&self.pool, scope, &candidate_ids).await {
            Ok(earlier) if !earlier.is_empty() => earlier,
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(%error, "cannot read earlier facts for the conflict check");
                return;
            }
        };
        let judgement = match judge_conflicts(llm, created, &earlier).await {
            Ok(judgement) => judgement,
            Err(error) => {
                self.metrics.record_llm_fallback("fact_conflicts");
                tracing::warn!(%error, "the LLM could not judge conflicts; the subject rules stand");
                return;
            }
        };
        if judgement.unknown_labels > 0 {
            tracing::warn!(
                unknown = judgement.unknown_labels,
                "the LLM named facts it was not given; ignored"
            );
        }
        let applied = async {
            let mut connection = self.pool.acquire().await?;
            write_path::supersede_judged(&mut connection, scope, &judgement.pairs, "llm").await
        }
        .await;
        match applied {
            Ok(applied) if !applied.is_empty() => {
                self.metrics.record_facts_superseded(applied.len() as u64);
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "cannot supersede the facts the LLM judged"),
        }
    }

    /// Episodes a failure or a crash left unconsolidated.
    pub(crate) async fn consolidate_leftovers(&self) -> Result<(), IngestError> {
        let leftovers = segments::unconsolidated_episodes(
            &self.pool,
            Utc::now() - LEFTOVER_AGE,
            LEFTOVERS_PER_SWEEP,
        )
        .await?;
        for episode in leftovers {
            let Ok(space) = engram_core::SpaceName::parse("space", &episode.space) else {
                continue;
            };
            let scope = Scope {
                user_id: engram_core::UserId::from_uuid(episode.user_id),
                space,
            };
            if let Err(error) = self.consolidate_episode(&scope, episode.id).await {
                tracing::warn!(%error, episode = %episode.id, "cannot consolidate the episode");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use engram_core::Category;

    use super::*;

    #[test]
    fn every_kind_of_established_item_is_a_fact_with_its_category() {
        let summary = StructuredSummary {
            facts: vec!["I've been doing Python for five years".into(), "  ".into()],
            preferences: vec!["I prefer tea over coffee".into()],
            decisions: vec!["We decided to ship on Friday".into()],
            todos: vec!["Send the invoice to Dana".into()],
            goals: vec!["Run a marathon in spring".into()],
            entities: vec!["Dana".into()],
            ..StructuredSummary::default()
        };
        let facts = summary.established();
        let categories: Vec<Category> = facts.iter().map(|(_, c)| *c).collect();
        assert_eq!(
            categories,
            [
                Category::Experience,
                Category::Preference,
                Category::Decision,
                Category::Todo,
                Category::Goal
            ]
        );
        assert!(
            facts.iter().all(|(text, _)| text != "Dana"),
            "entities are no facts"
        );
    }
}
