//! Grading: how useful each retrieved memory was in a conversation, Again / Hard / Good / Easy.
//!
//! With an LLM (any OpenAI-compatible endpoint), the conversation and the memories go to it as
//! Markdown and it answers one rating per memory (a strict JSON schema). Memories it leaves out,
//! and labels it invents, are logged and counted, never guessed: the local grader rates what it
//! left out. When it fails (down, slow, garbage after the client's retries), the local grader
//! rates everything and says so — or, configured so, the failure goes back to the caller (a bus
//! message is then retried and, in the end, dead-lettered).
//!
//! The local grader judges from what the assistant said (`engram_core::review`): the highest
//! cosine of the memory to one of the assistant's turns and the share of its salient terms the
//! assistant used, weighted into an evidence score, banded by calibrated thresholds.

use std::sync::Arc;

use engram_core::SpeakerRole;
use engram_core::episode::SegmentTurn;
use engram_core::review::{GradeSignals, GraderThresholds, Rating, SaidTerms, grade};
use engram_embed::{Embedder, cosine};
use engram_llm::{ChatClient, LlmError, StructuredRequest};
use serde::Deserialize;
use uuid::Uuid;

use crate::error::ReviewError;
use crate::metrics::ReviewMetrics;

/// A memory as the graders read it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryForGrading {
    pub id: Uuid,
    pub title: Option<String>,
    pub text: String,
    pub queries: Vec<String>,
}

impl MemoryForGrading {
    /// Title and summary (facts: their text), as the memory is compared with the conversation.
    fn content(&self) -> String {
        match &self.title {
            Some(title) if !title.is_empty() => format!("{title}\n{}", self.text),
            _ => self.text.clone(),
        }
    }
}

/// A rating and who gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Graded {
    pub memory_id: Uuid,
    pub rating: Rating,
    /// `llm`, `local`, or `local: <why the LLM did not>`.
    pub graded_by: String,
    /// The local grader's evidence, when it graded.
    pub evidence: Option<f64>,
}

/// Which grader a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraderChoice {
    /// The LLM when one is configured, the local grader otherwise.
    Configured,
    Local,
    Llm,
}

/// Grades memories; cheap to clone.
#[derive(Clone)]
pub struct Grader {
    pub llm: Option<ChatClient>,
    pub embedder: Option<Arc<dyn Embedder>>,
    pub thresholds: GraderThresholds,
    /// When the LLM fails: grade locally (true) or fail the review (false).
    pub fall_back_locally: bool,
    pub metrics: Arc<ReviewMetrics>,
}

impl std::fmt::Debug for Grader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grader")
            .field("llm", &self.llm.as_ref().map(ChatClient::model))
            .field("thresholds", &self.thresholds)
            .finish()
    }
}

impl Grader {
    /// Grades `memories` against `context`; `turn_vectors` holds the turns' stored embeddings
    /// where known (in the order of `context`; may be shorter or empty).
    pub async fn grade(
        &self,
        context: &[SegmentTurn],
        turn_vectors: &[Option<Vec<f32>>],
        memories: &[MemoryForGrading],
        choice: GraderChoice,
    ) -> Result<Vec<Graded>, ReviewError> {
        if memories.is_empty() {
            return Ok(Vec::new());
        }
        let llm = match (choice, &self.llm) {
            (GraderChoice::Local, _) | (GraderChoice::Configured, None) => None,
            (GraderChoice::Llm, None) => {
                return Err(ReviewError::FailedPrecondition(
                    "no LLM is configured for grading (ENGRAM_LLM__PROVIDER); ask for the local grader".into(),
                ));
            }
            (_, Some(llm)) => Some(llm),
        };
        let Some(llm) = llm else {
            return Ok(self
                .grade_locally(context, turn_vectors, memories, "local")
                .await);
        };
        match ask_llm(llm, context, memories).await {
            Ok(answer) => {
                if answer.unknown_labels > 0 {
                    self.metrics.record_invented(answer.unknown_labels as u64);
                    tracing::warn!(
                        unknown = answer.unknown_labels,
                        "the LLM rated memories it was not given; ignored"
                    );
                }
                let left_out: Vec<MemoryForGrading> = memories
                    .iter()
                    .filter(|m| !answer.ratings.iter().any(|(id, _)| *id == m.id))
                    .cloned()
                    .collect();
                let mut graded: Vec<Graded> = answer
                    .ratings
                    .into_iter()
                    .map(|(memory_id, rating)| Graded {
                        memory_id,
                        rating,
                        graded_by: "llm".into(),
                        evidence: None,
                    })
                    .collect();
                if !left_out.is_empty() {
                    self.metrics.record_omitted(left_out.len() as u64);
                    tracing::warn!(
                        omitted = left_out.len(),
                        "the LLM left memories unrated; the local grader rates them"
                    );
                    graded.extend(
                        self.grade_locally(
                            context,
                            turn_vectors,
                            &left_out,
                            "local: the LLM left it out",
                        )
                        .await,
                    );
                }
                // In the order asked.
                graded.sort_by_key(|g| memories.iter().position(|m| m.id == g.memory_id));
                Ok(graded)
            }
            Err(error) if self.fall_back_locally => {
                self.metrics.record_llm_fallback();
                tracing::warn!(%error, "the LLM could not grade; the local grader rates the memories");
                Ok(self
                    .grade_locally(context, turn_vectors, memories, "local: the LLM failed")
                    .await)
            }
            Err(error) => Err(ReviewError::Llm(error)),
        }
    }

    /// The local grade of each memory: from the assistant's turns (all turns if the assistant
    /// said nothing).
    async fn grade_locally(
        &self,
        context: &[SegmentTurn],
        turn_vectors: &[Option<Vec<f32>>],
        memories: &[MemoryForGrading],
        graded_by: &str,
    ) -> Vec<Graded> {
        let assistant: Vec<usize> = (0..context.len())
            .filter(|&index| context[index].role == SpeakerRole::Assistant)
            .collect();
        let said: Vec<usize> = if assistant.is_empty() {
            (0..context.len()).collect()
        } else {
            assistant
        };
        let said_terms = SaidTerms::of(
            &said
                .iter()
                .map(|&index| context[index].content.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        );
        let similarities = self
            .similarities(context, turn_vectors, &said, memories)
            .await;
        memories
            .iter()
            .zip(similarities)
            .map(|(memory, (similarity, topic))| {
                let signals = GradeSignals {
                    similarity,
                    overlap: said_terms.overlap(&memory.content()),
                    topic,
                };
                Graded {
                    memory_id: memory.id,
                    rating: grade(&signals, &self.thresholds),
                    graded_by: graded_by.to_owned(),
                    evidence: Some(signals.evidence(&self.thresholds)),
                }
            })
            .collect()
    }

    /// For each memory, its highest cosine to one of the turns `said` (indexes into `context`)
    /// and to any turn of the conversation, in the topic embedder's vectors
    /// (`engram_embed::Embedders::topic`: with the local model, static token vectors that cost
    /// no inference). The turn vectors segmentation stored are used as they are; the memories
    /// and the other turns are embedded here. A memory without a vector (no embedder, or it
    /// failed) scores 0 and the term overlap carries its grade alone.
    async fn similarities(
        &self,
        context: &[SegmentTurn],
        turn_vectors: &[Option<Vec<f32>>],
        said: &[usize],
        memories: &[MemoryForGrading],
    ) -> Vec<(f64, f64)> {
        let mut memory_vectors: Vec<Option<Vec<f32>>> = vec![None; memories.len()];
        let mut turn_vectors: Vec<Option<Vec<f32>>> = (0..context.len())
            .map(|index| turn_vectors.get(index).cloned().flatten())
            .collect();
        let missing_memories: Vec<usize> = (0..memories.len())
            .filter(|&index| memory_vectors[index].is_none())
            .collect();
        let missing_turns: Vec<usize> = (0..context.len())
            .filter(|&index| turn_vectors[index].is_none())
            .collect();
        if let Some(embedder) = &self.embedder
            && !context.is_empty()
            && (!missing_memories.is_empty() || !missing_turns.is_empty())
        {
            let texts: Vec<String> = missing_memories
                .iter()
                .map(|&index| memories[index].content())
                .chain(
                    missing_turns
                        .iter()
                        .map(|&index| context[index].content.clone()),
                )
                .collect();
            match embedder.embed(&texts).await {
                Ok(vectors) if vectors.len() == texts.len() => {
                    let mut vectors = vectors.into_iter();
                    for (&index, vector) in missing_memories.iter().zip(vectors.by_ref()) {
                        memory_vectors[index] = Some(vector);
                    }
                    for (&index, vector) in missing_turns.iter().zip(vectors) {
                        turn_vectors[index] = Some(vector);
                    }
                }
                Ok(_) => tracing::warn!("the embedder answered the wrong number of vectors"),
                Err(error) => {
                    tracing::warn!(%error, "cannot embed for grading; stored vectors and term overlap decide");
                }
            }
        }
        memory_vectors
            .iter()
            .map(|memory| {
                let Some(memory) = memory else {
                    return (0.0, 0.0);
                };
                let mut used = 0.0f64;
                let mut topic = 0.0f64;
                for (index, turn) in turn_vectors.iter().enumerate() {
                    // A vector of another model (its length differs) is not comparable.
                    let Some(turn) = turn.as_ref().filter(|turn| turn.len() == memory.len()) else {
                        continue;
                    };
                    let similarity = f64::from(cosine(memory, turn));
                    topic = topic.max(similarity);
                    if said.contains(&index) {
                        used = used.max(similarity);
                    }
                }
                (used, topic)
            })
            .collect()
    }
}

const SYSTEM_PROMPT: &str = "\
You review the long-term memory of an assistant. During the conversation below, the assistant \
was handed some memories about the user. Rate how useful each one really was:
- again: not used at all; noise for this conversation;
- hard: related to the topic, but the assistant did not use it, or connecting it takes real \
inference;
- good: directly relevant; the assistant's replies visibly reflect it;
- easy: a core pillar; the conversation could not have gone as it did without it.
Judge by what the assistant actually said and did, not by the topic alone. A memory that \
several queries retrieved may matter more, but only its use decides. Rate every memory, by its \
label.";

fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["ratings"],
        "properties": {
            "ratings": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["memory", "rating"],
                    "properties": {
                        "memory": {"type": "string"},
                        "rating": {"type": "string", "enum": ["again", "hard", "good", "easy"]}
                    }
                }
            }
        }
    })
}

#[derive(Debug, Deserialize)]
struct Answer {
    ratings: Vec<AnswerRating>,
}

#[derive(Debug, Deserialize)]
struct AnswerRating {
    memory: String,
    rating: String,
}

struct LlmRatings {
    ratings: Vec<(Uuid, Rating)>,
    unknown_labels: usize,
}

/// The conversation and the memories as the reviewer reads them.
fn render(context: &[SegmentTurn], memories: &[MemoryForGrading]) -> String {
    let mut markdown = String::from("## Conversation\n\n");
    for turn in context {
        markdown.push_str(&format!(
            "- {}: \"{}\"\n",
            turn.role.as_str(),
            turn.content
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    markdown.push_str("\n## Memories handed to the assistant\n");
    for (index, memory) in memories.iter().enumerate() {
        markdown.push_str(&format!("\n### M{}\n", index + 1));
        if let Some(title) = memory.title.as_deref().filter(|t| !t.is_empty()) {
            markdown.push_str(&format!("**Title:** {title}\n"));
        }
        markdown.push_str(&format!(
            "**Summary:** {}\n",
            memory.text.split_whitespace().collect::<Vec<_>>().join(" ")
        ));
        if !memory.queries.is_empty() {
            let queries: Vec<String> = memory.queries.iter().map(|q| format!("\"{q}\"")).collect();
            markdown.push_str(&format!("**Retrieved by:** {}\n", queries.join(", ")));
        }
    }
    markdown
}

async fn ask_llm(
    client: &ChatClient,
    context: &[SegmentTurn],
    memories: &[MemoryForGrading],
) -> Result<LlmRatings, LlmError> {
    let schema = schema();
    let user = render(context, memories);
    let answer = client
        .structured::<Answer>(&StructuredRequest {
            task: "memory_review",
            system: SYSTEM_PROMPT,
            user: &user,
            schema: &schema,
        })
        .await?;
    let mut ratings: Vec<(Uuid, Rating)> = Vec::new();
    let mut unknown_labels = 0;
    for rated in answer.value.ratings {
        let memory = rated
            .memory
            .trim()
            .trim_start_matches(['M', 'm'])
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|index| memories.get(index));
        let rating = Rating::parse(&rated.rating);
        match (memory, rating) {
            (Some(memory), Some(rating)) if !ratings.iter().any(|(id, _)| *id == memory.id) => {
                ratings.push((memory.id, rating));
            }
            (Some(_), Some(_)) => {}
            // A label it was not given, or a rating outside the four: never guessed at.
            _ => unknown_labels += 1,
        }
    }
    Ok(LlmRatings {
        ratings,
        unknown_labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reviewer_reads_labels_summaries_and_queries() {
        let context = vec![
            SegmentTurn {
                role: SpeakerRole::User,
                content: "Lifetimes confuse me".into(),
            },
            SegmentTurn {
                role: SpeakerRole::Assistant,
                content: "You said you learn best by building things".into(),
            },
        ];
        let memories = vec![MemoryForGrading {
            id: Uuid::from_u128(1),
            title: Some("Learning style".into()),
            text: "The user prefers hands-on projects".into(),
            queries: vec!["learning preferences".into()],
        }];
        let markdown = render(&context, &memories);
        assert!(
            markdown.contains("- user: \"Lifetimes confuse me\""),
            "{markdown}"
        );
        assert!(
            markdown.contains("### M1\n**Title:** Learning style\n"),
            "{markdown}"
        );
        assert!(markdown.contains("**Retrieved by:** \"learning preferences\""));
    }

    /// The local grader over the installed model's token vectors (`make models`), with the
    /// default thresholds.
    fn local_grader() -> Grader {
        let model = engram_embed::LocalEmbedder::load(&engram_embed::LocalModelSettings {
            model_dir: engram_embed::installed_model_dir(),
            max_batch: 32,
            max_tokens: 256,
            inference_nice: 0,
            yield_to_requests: None,
        })
        .expect("the local model (make models)");
        Grader {
            llm: None,
            embedder: Some(Arc::new(engram_embed::TokenVectorEmbedder::new(model))),
            thresholds: GraderThresholds {
                hard: 0.24,
                good: 0.28,
                easy: 0.40,
                overlap_weight: 0.7,
                topic: 0.42,
            },
            fall_back_locally: true,
            metrics: Arc::new(ReviewMetrics::default()),
        }
    }

    fn memory(id: u128, text: &str) -> MemoryForGrading {
        MemoryForGrading {
            id: Uuid::from_u128(id),
            title: None,
            text: text.into(),
            queries: Vec::new(),
        }
    }

    #[tokio::test]
    async fn what_the_assistant_said_outweighs_the_topic_and_the_unrelated() {
        let context = vec![
            SegmentTurn {
                role: SpeakerRole::User,
                content: "What should I cook for dinner tonight? Something with noodles maybe"
                    .into(),
            },
            SegmentTurn {
                role: SpeakerRole::Assistant,
                content: "Since you are vegetarian, a mushroom and spinach pasta is quick".into(),
            },
        ];
        // The first memory is what the assistant used; the second is on the user's topic but
        // unused; the third has nothing to do with either.
        let memories = vec![
            memory(1, "The user has been vegetarian since May"),
            memory(2, "The user loves ramen noodles"),
            memory(3, "The user's bicycle has a flat tyre"),
        ];
        // Stored turn vectors are not needed: the turns are embedded here too.
        let graded = local_grader()
            .grade(&context, &[], &memories, GraderChoice::Configured)
            .await
            .unwrap();
        let evidence: Vec<f64> = graded.iter().map(|g| g.evidence.unwrap()).collect();
        assert!(
            evidence[0] > evidence[1] && evidence[1] > evidence[2],
            "{evidence:?}"
        );
        assert!(graded[0].rating >= Rating::Good, "{graded:?}");
        assert_eq!(graded[2].rating, Rating::Again, "{graded:?}");
        assert!(graded.iter().all(|g| g.graded_by == "local"));
    }

    #[test]
    fn the_schema_is_strict_and_names_the_four_ratings() {
        let schema = schema();
        let item = &schema["properties"]["ratings"]["items"];
        assert_eq!(item["additionalProperties"], false);
        assert_eq!(
            item["properties"]["rating"]["enum"],
            serde_json::json!(["again", "hard", "good", "easy"])
        );
    }
}
