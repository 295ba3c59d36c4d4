//! The LLM's part in segmentation: one structured question per closed segment, answered with a
//! title, a summary, the segment's surprise and what it established. Any failure (the endpoint
//! down, a malformed, truncated or refused answer after the client's own retries) is the
//! caller's cue to fall back to the local rules; nothing is ever made up from a bad answer.

use engram_core::episode::StructuredSummary;
use engram_llm::{ChatClient, LlmError, StructuredRequest, TokenUsage};
use serde::Deserialize;

use super::segmentation::SegmentText;

const SYSTEM_PROMPT: &str = "\
You keep the long-term memory of an assistant. You are given one closed segment of a \
conversation between a user and the assistant, and you describe it so that it can be recalled \
later:
- title: what the segment was about, in at most eight words;
- summary: at most three sentences in the third person (\"The user ...\"), keeping the names, \
numbers, dates and decisions that matter;
- surprise: how unusual the segment is for this user, from 0 (routine) to 1 (a rare, notable \
event such as a move, a new job, a loss, a big decision);
- what the segment established, each item one self-contained sentence: durable facts about the \
user, their preferences, decisions taken, things to do, goals, and the people, places, projects \
or products named (entities: just the names).
Write in the language of the conversation. Use only what the segment says; leave a list empty \
when it established nothing of that kind. Never invent.";

/// The answer's schema (strict: every property required, nothing else allowed).
fn schema() -> serde_json::Value {
    let list = serde_json::json!({"type": "array", "items": {"type": "string"}});
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["title", "summary", "surprise", "established"],
        "properties": {
            "title": {"type": "string"},
            "summary": {"type": "string"},
            "surprise": {"type": "number", "minimum": 0, "maximum": 1},
            "established": {
                "type": "object",
                "additionalProperties": false,
                "required": ["facts", "preferences", "decisions", "todos", "goals", "entities"],
                "properties": {
                    "facts": list, "preferences": list, "decisions": list,
                    "todos": list, "goals": list, "entities": list
                }
            }
        }
    })
}

#[derive(Debug, Deserialize)]
struct Answer {
    title: String,
    summary: String,
    surprise: f64,
    established: StructuredSummary,
}

/// What the LLM made of a segment.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmEpisode {
    pub title: String,
    pub summary: String,
    pub surprise: f64,
    pub structured: StructuredSummary,
    pub usage: TokenUsage,
}

/// The segment as the LLM reads it.
fn render(turns: &[SegmentText]) -> String {
    let mut markdown = String::from("## Conversation segment\n\n");
    for turn in turns {
        markdown.push_str(&format!(
            "- {} ({}): \"{}\"\n",
            turn.role.as_str(),
            turn.spoken_at.format("%Y-%m-%d %H:%M"),
            turn.content
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    markdown
}

/// Asks the LLM to describe a segment. An answer that is empty where it must not be counts as
/// malformed.
pub async fn describe_segment(
    client: &ChatClient,
    turns: &[SegmentText],
) -> Result<LlmEpisode, LlmError> {
    let schema = schema();
    let user = render(turns);
    let answer = client
        .structured::<Answer>(&StructuredRequest {
            task: "segment_episode",
            system: SYSTEM_PROMPT,
            user: &user,
            schema: &schema,
        })
        .await?;
    let Answer {
        title,
        summary,
        surprise,
        established,
    } = answer.value;
    let title = title.trim().to_owned();
    let summary = summary.trim().to_owned();
    if title.is_empty() || summary.is_empty() {
        return Err(LlmError::Malformed(
            "the answer has an empty title or summary".into(),
        ));
    }
    if !surprise.is_finite() {
        return Err(LlmError::Malformed(format!(
            "surprise {surprise} is not a number"
        )));
    }
    Ok(LlmEpisode {
        title,
        summary,
        surprise: surprise.clamp(0.0, 1.0),
        structured: established,
        usage: answer.usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_is_strict_everywhere() {
        fn check(value: &serde_json::Value) {
            if value["type"] == "object" {
                assert_eq!(value["additionalProperties"], false, "{value}");
                let properties = value["properties"].as_object().unwrap();
                let required: Vec<&str> = value["required"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect();
                for (name, property) in properties {
                    assert!(required.contains(&name.as_str()), "{name} is not required");
                    check(property);
                }
            }
        }
        check(&schema());
    }
}

const CONFLICT_PROMPT: &str = "\
You keep a user's long-term memory consistent. You are given facts just learned from a \
conversation (N1, N2, ...) and facts remembered before (E1, E2, ...). For each new fact, list \
the earlier facts it makes no longer true: the same thing about the user with a different value \
now (a new address, a new manager, a changed preference, a plan that was replaced or \
cancelled). An earlier fact that is only related, or still true alongside the new one, is not \
superseded. Answer with the labels given; when nothing is superseded, answer an empty list.";

fn conflict_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["superseded"],
        "properties": {
            "superseded": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["new", "earlier"],
                    "properties": {
                        "new": {"type": "string"},
                        "earlier": {"type": "array", "items": {"type": "string"}}
                    }
                }
            }
        }
    })
}

#[derive(Debug, Deserialize)]
struct ConflictAnswer {
    superseded: Vec<Superseded>,
}

#[derive(Debug, Deserialize)]
struct Superseded {
    new: String,
    earlier: Vec<String>,
}

/// What the LLM judged: `(earlier, newer)` pairs, and how many labels it named that were not
/// given (never guessed at: left out and counted).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConflictJudgement {
    pub pairs: Vec<(uuid::Uuid, uuid::Uuid)>,
    pub unknown_labels: usize,
}

/// Asks which earlier facts the new ones supersede.
pub async fn judge_conflicts(
    client: &ChatClient,
    new_facts: &[(uuid::Uuid, String)],
    earlier: &[(uuid::Uuid, String)],
) -> Result<ConflictJudgement, LlmError> {
    let mut user = String::from("## New facts\n\n");
    for (index, (_, text)) in new_facts.iter().enumerate() {
        user.push_str(&format!("- N{}: {}\n", index + 1, text));
    }
    user.push_str("\n## Earlier facts\n\n");
    for (index, (_, text)) in earlier.iter().enumerate() {
        user.push_str(&format!("- E{}: {}\n", index + 1, text));
    }
    let schema = conflict_schema();
    let answer = client
        .structured::<ConflictAnswer>(&StructuredRequest {
            task: "fact_conflicts",
            system: CONFLICT_PROMPT,
            user: &user,
            schema: &schema,
        })
        .await?;
    let label = |prefix: char, label: &str, of: &[(uuid::Uuid, String)]| {
        label
            .trim()
            .strip_prefix(prefix)
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|n| n.checked_sub(1))
            .and_then(|index| of.get(index))
            .map(|(id, _)| *id)
    };
    let mut judgement = ConflictJudgement::default();
    for superseded in answer.value.superseded {
        let Some(newer) = label('N', &superseded.new, new_facts) else {
            judgement.unknown_labels += 1;
            continue;
        };
        for old in superseded.earlier {
            match label('E', &old, earlier) {
                Some(older) if !judgement.pairs.contains(&(older, newer)) => {
                    judgement.pairs.push((older, newer));
                }
                Some(_) => {}
                None => judgement.unknown_labels += 1,
            }
        }
    }
    Ok(judgement)
}
