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
