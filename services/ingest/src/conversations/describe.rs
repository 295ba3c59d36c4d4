//! Describing a closed segment: its title, summary, surprise and what it established, by the
//! LLM when one is configured, by the extractive rules of `engram_core::episode` otherwise or
//! when the LLM fails. Both give a [`Description`] of the same shape (items that say whom they
//! are about, each with the time of the turn that said it where known), so segmentation and
//! consolidation do not care which wrote it.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use engram_core::episode::{StructuredSummary, extractive_episode};
use engram_llm::ChatClient;

use super::llm::describe_segment;
pub(crate) use super::segment_text::SegmentText;
use crate::metrics::IngestMetrics;

/// Who may describe a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Describers {
    /// The LLM when one is configured, the extractive rules otherwise or when it fails.
    LlmThenRules,
    /// The extractive rules only.
    RulesOnly,
}

/// What a describer made of a segment.
#[derive(Debug, Clone)]
pub(crate) struct Description {
    pub(crate) title: String,
    pub(crate) summary: String,
    pub(crate) structured: StructuredSummary,
    /// The LLM's judgement; none from the rules (the embedding measures it later).
    pub(crate) surprise: Option<f64>,
    /// `llm` or `extractive`, for the audit.
    pub(crate) described_by: &'static str,
}

/// The LLM (when configured) and the extractive rules behind one call; cheap to clone.
#[derive(Clone)]
pub(crate) struct Describer {
    pub(crate) llm: Option<ChatClient>,
    pub(crate) metrics: Arc<IngestMetrics>,
    /// A memory's text limit: the summary's and each fact's.
    pub(crate) max_text_chars: usize,
}

impl Describer {
    /// Title, summary, structured summary and (from an LLM) surprise of a segment, and who wrote
    /// them: the LLM, or the extractive rules when there is none or it failed.
    pub(crate) async fn describe(
        &self,
        turns: &[SegmentText],
        describers: Describers,
    ) -> Description {
        let llm = match describers {
            Describers::LlmThenRules => self.llm.as_ref(),
            Describers::RulesOnly => None,
        };
        if let Some(llm) = llm {
            match describe_segment(llm, turns, self.max_text_chars).await {
                Ok(episode) => {
                    return Description {
                        title: episode.title,
                        summary: episode.summary,
                        structured: episode.structured,
                        surprise: Some(episode.surprise),
                        described_by: "llm",
                    };
                }
                Err(error) => {
                    self.metrics.record_llm_fallback("segment_episode");
                    tracing::warn!(%error, "the LLM could not describe the segment; using the extractive rules");
                }
            }
        }
        let spoken: Vec<DateTime<Utc>> = turns.iter().map(|turn| turn.spoken_at).collect();
        let turns: Vec<engram_core::episode::SegmentTurn> = turns
            .iter()
            .map(|turn| engram_core::episode::SegmentTurn {
                role: turn.role,
                content: turn.content.clone(),
            })
            .collect();
        // Tens of turns of up to 8,192 characters each: work for a blocking thread.
        let mut draft = engram_recall::cpu_bound(move || extractive_episode(&turns)).await;
        for fact in &draft.facts {
            if let Some(turn) = spoken.get(fact.turn) {
                draft.structured.said_at.insert(fact.text.clone(), *turn);
            }
        }
        Description {
            title: draft.title,
            summary: draft.summary,
            structured: draft.structured,
            surprise: None,
            described_by: "extractive",
        }
    }
}
