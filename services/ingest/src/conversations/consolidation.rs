//! Consolidation: the facts an episode established become semantic memories.
//!
//! The facts are the episode's structured summary (written by the LLM, or by the extractive
//! rules): its facts, preferences, decisions, todos and goals, each with its category. Each goes
//! through the normal write path as a Remember from the episode's conversation, so tombstones,
//! memory off and incognito are honoured, a fact said in several episodes merges into one entry
//! that lists every episode (`source_episode_ids`, repeat_count raised), and a fact stating a new
//! value of a subject supersedes the older one. `consolidated_at` is set once every fact is
//! written; running it again for the same episode changes nothing (a fact whose entry already
//! lists the episode is left as it is).

use chrono::{Duration, Utc};
use engram_core::episode::StructuredSummary;
use engram_core::{Category, ConversationId, MemoryText, Scope, importance, metadata};
use engram_store::memories;
use engram_store::segments;
use uuid::Uuid;

use super::segmentation::Segmenter;
use crate::error::IngestError;
use crate::write_path::{RememberCommand, RememberResult};

/// Keywords kept with a consolidated fact.
const MAX_FACT_KEYWORDS: usize = 8;
/// Episodes left unconsolidated this long (a crash, a failure) are taken by the sweep.
const LEFTOVER_AGE: Duration = Duration::seconds(10);
/// Episodes one sweep consolidates, at most.
const LEFTOVERS_PER_SWEEP: i64 = 50;

/// The facts of a structured summary, with their categories.
pub fn facts_of(summary: &StructuredSummary) -> Vec<(String, Category)> {
    let by_kind: [(&Vec<String>, Option<Category>); 5] = [
        (&summary.facts, None),
        (&summary.preferences, Some(Category::Preference)),
        (&summary.decisions, Some(Category::Decision)),
        (&summary.todos, Some(Category::Todo)),
        (&summary.goals, Some(Category::Goal)),
    ];
    let mut facts = Vec::new();
    for (texts, category) in by_kind {
        for text in texts {
            let text = text.trim();
            if text.is_empty() || facts.iter().any(|(known, _)| known == text) {
                continue;
            }
            // A plain fact may still be an experience or a guideline.
            let category = category.unwrap_or_else(|| importance::infer_category(text));
            facts.push((text.to_owned(), category));
        }
    }
    facts
}

impl Segmenter {
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
        for (text, category) in facts_of(&summary) {
            let Ok(text) = MemoryText::parse("fact", &text, max_chars) else {
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
                    valid_at: episode.end_at,
                    ..RememberCommand::plain(scope.clone(), text)
                })
                .await?;
            if matches!(
                result,
                RememberResult::Created { .. } | RememberResult::Merged { .. }
            ) {
                written += 1;
            }
        }
        if segments::mark_consolidated(&self.pool, scope, episode.id).await? {
            self.metrics.record_facts_derived(written as u64);
            tracing::info!(episode = %episode.id, facts = written, "episode consolidated");
        }
        Ok(written)
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
        };
        let facts = facts_of(&summary);
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
