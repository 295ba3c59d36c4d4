//! The LLM's part in segmentation: one structured question per closed segment, answered with a
//! title, a summary, the segment's surprise and what it established. Any failure (the endpoint
//! down, a malformed, truncated, refused or oversized answer after the client's own retries) is
//! the caller's cue to fall back to the local rules; nothing is ever made up from a bad answer.
//!
//! What the LLM writes is taken in as a user's text is ([`episode_of`]): a model can answer
//! anything — a NUL that Postgres refuses, a title of 100,000 characters, 2,000 "facts" — and
//! none of it may reach the store unchecked.

use chrono::{DateTime, Utc};
use engram_core::episode::{MAX_ENTITIES, StructuredSummary, truncate_at_word};
use engram_core::sanitize::strip_steering;
use engram_core::validate::check_label;
use engram_core::{MemoryText, ValidationError};
use engram_llm::{ChatClient, LlmError, StructuredRequest, TokenUsage};
use serde::Deserialize;

use super::segment_text::SegmentText;
use crate::import::MAX_TITLE_CHARS;
use crate::write_path::MAX_TAG_CHARS;

/// Items an answer may establish for one segment, its facts, preferences, decisions, todos and
/// goals together: each becomes a semantic memory, and a segment (at most twice the
/// segmentation's `max_turns`, 40 by default) that states more than this is not being described.
pub const MAX_FACTS_PER_SEGMENT: usize = 50;
/// Of a title or summary, at most this many times its limit in characters is read: an answer of
/// megabytes costs no more to clean than one just over the limit.
const READ_BEYOND_LIMIT: usize = 4;
/// Bytes of UTF-8 one character takes at most: a text of more bytes than `4 × limit` is over
/// the limit, known without reading it.
const MAX_UTF8_BYTES: usize = 4;

const SYSTEM_PROMPT: &str = "\
You keep the long-term memory of an assistant. You are given one closed segment of a \
conversation, its turns numbered, and you describe it so that it can be recalled later:
- title: the topic of the segment as a short phrase of at most eight words (not a list of names);
- summary: at most three sentences in the third person keeping the names, numbers, dates and \
decisions that matter; never greetings, thanks or small talk;
- surprise: how unusual the segment is for this user, from 0 (routine) to 1 (a rare, notable \
event such as a move, a new job, a loss, a big decision);
- what the segment established, each item one self-contained sentence with the number of the \
turn that said it: lasting facts about a speaker, their preferences, experiences (what happened \
to them), guidelines (how the user wants the assistant to behave; only the user's), decisions \
taken, things to do, goals, and the people, places, projects or products named (entities: just \
the names).
Each item says whom it is about: in a conversation between a user and the assistant, the user \
(\"The user ...\"), never the assistant's own suggestions unless the user confirmed them; where \
the turns name their speakers (\"Nate: ...\"), begin the item with that name and a colon \
(\"Nate: ...\"). Greetings, thanks, reactions, compliments, questions and vague plans are no \
items. Write in the language of the conversation. Use only what the segment says; leave a list \
empty when it established nothing of that kind. Never invent.";

/// The answer's schema (strict: every property required, nothing else allowed).
fn schema() -> serde_json::Value {
    let said = serde_json::json!({
        "type": "array",
        "items": {
            "type": "object",
            "additionalProperties": false,
            "required": ["text", "turn"],
            "properties": {"text": {"type": "string"}, "turn": {"type": "integer"}}
        }
    });
    let names = serde_json::json!({"type": "array", "items": {"type": "string"}});
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
                "required": ["facts", "preferences", "experiences", "guidelines", "decisions",
                             "todos", "goals", "entities"],
                "properties": {
                    "facts": said, "preferences": said, "experiences": said,
                    "guidelines": said, "decisions": said, "todos": said, "goals": said,
                    "entities": names
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
    established: Established,
}

/// An established item as the LLM answers it: with the number of the turn that said it (the
/// schema asks for it), or a bare sentence (a model that ignores the schema's shape; its item
/// holds from the episode's end).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
enum Said {
    Bare(String),
    Turn { text: String, turn: Option<i64> },
}

impl Said {
    fn into_parts(self) -> (String, Option<i64>) {
        match self {
            Said::Bare(text) => (text, None),
            Said::Turn { text, turn } => (text, turn),
        }
    }
}

/// What the LLM says a segment established; a list it leaves out reads as empty.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct Established {
    facts: Vec<Said>,
    preferences: Vec<Said>,
    decisions: Vec<Said>,
    todos: Vec<Said>,
    goals: Vec<Said>,
    experiences: Vec<Said>,
    guidelines: Vec<Said>,
    entities: Vec<String>,
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

/// The segment as the LLM reads it, its turns numbered from 1 (the numbers items cite).
fn render(turns: &[SegmentText]) -> String {
    let mut markdown = String::from("## Conversation segment\n\n");
    for (number, turn) in turns.iter().enumerate() {
        markdown.push_str(&format!(
            "- [{}] {} ({}): \"{}\"\n",
            number + 1,
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

/// Asks the LLM to describe a segment, and takes the answer in as [`episode_of`] says;
/// `max_text_chars` is the limit of a memory's text (the summary's, and each fact's).
pub async fn describe_segment(
    client: &ChatClient,
    turns: &[SegmentText],
    max_text_chars: usize,
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
    let spoken: Vec<DateTime<Utc>> = turns.iter().map(|turn| turn.spoken_at).collect();
    let (episode, cleaning) = episode_of(answer.value, &spoken, max_text_chars)?;
    if cleaning != Cleaning::default() {
        tracing::warn!(
            title_cut = cleaning.title_cut,
            summary_cut = cleaning.summary_cut,
            facts_dropped = cleaning.facts_dropped,
            entities_dropped = cleaning.entities_dropped,
            "the LLM's answer went beyond what an episode holds; kept what fits"
        );
    }
    Ok(LlmEpisode {
        usage: answer.usage,
        ..episode
    })
}

/// What taking an answer in changed, for the log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Cleaning {
    title_cut: bool,
    summary_cut: bool,
    /// Facts (of any kind) left out: blank, too long, or beyond [`MAX_FACTS_PER_SEGMENT`].
    facts_dropped: usize,
    /// Entities left out: blank, longer than a tag, repeated, or beyond [`MAX_ENTITIES`].
    entities_dropped: usize,
}

/// An answer as an episode, each of its texts taken in as a user's would be: what steers a
/// display (NUL and the other controls, escape sequences, bidi overrides) removed by
/// [`strip_steering`], and each within what a client may send — the title within an imported
/// title's [`MAX_TITLE_CHARS`] on one line, the summary and each fact within a memory's text
/// (`max_text_chars`), each entity within a tag's [`MAX_TAG_CHARS`]; and at most
/// [`MAX_FACTS_PER_SEGMENT`] facts and [`MAX_ENTITIES`] entities. A title or summary too long is
/// cut at a word and ends in "…"; a fact or an entity too long is left out (a fact cut short
/// says something else, a name cut short names no one). An answer without a visible title or
/// summary, or whose surprise is not a number, is malformed. An item citing a turn of the segment
/// (`spoken`: each turn's time, in order) holds from when that turn was said; an item citing
/// none, or a turn the segment does not have, from the episode's end.
fn episode_of(
    answer: Answer,
    spoken: &[DateTime<Utc>],
    max_text_chars: usize,
) -> Result<(LlmEpisode, Cleaning), LlmError> {
    let Answer {
        title,
        summary,
        surprise,
        established,
    } = answer;
    let ((title, title_cut), (summary, summary_cut)) =
        cleaned_title_and_summary(&title, &summary, max_text_chars)?;
    if !surprise.is_finite() {
        return Err(LlmError::Malformed(format!(
            "surprise {surprise} is not a number"
        )));
    }
    let Established {
        facts,
        preferences,
        decisions,
        todos,
        goals,
        experiences,
        guidelines,
        entities,
    } = established;
    let mut facts_dropped = 0;
    let mut lists = [
        facts,
        preferences,
        decisions,
        todos,
        goals,
        experiences,
        guidelines,
    ]
    .map(|list| {
        let (kept, dropped) = cleaned_facts(list, max_text_chars);
        facts_dropped += dropped;
        kept
    });
    facts_dropped += keep_in_turn(&mut lists, MAX_FACTS_PER_SEGMENT);
    // Times come from the turns the items cite, never from the model's words.
    let mut said_at = std::collections::BTreeMap::new();
    let texts = |list: Vec<(String, Option<i64>)>| -> Vec<String> {
        list.into_iter()
            .map(|(text, turn)| {
                let cited = turn
                    .and_then(|turn| usize::try_from(turn).ok())
                    .and_then(|turn| turn.checked_sub(1))
                    .and_then(|index| spoken.get(index));
                if let Some(at) = cited {
                    said_at.insert(text.clone(), *at);
                }
                text
            })
            .collect()
    };
    let [
        facts,
        preferences,
        decisions,
        todos,
        goals,
        experiences,
        guidelines,
    ] = lists.map(texts);
    let (entities, entities_dropped) = cleaned_entities(entities);
    Ok((
        LlmEpisode {
            title,
            summary,
            surprise: surprise.clamp(0.0, 1.0),
            structured: StructuredSummary {
                facts,
                preferences,
                decisions,
                todos,
                goals,
                experiences,
                guidelines,
                entities,
                // Experiences and guidelines have lists of their own: a fact is a fact.
                facts_are_plain: true,
                said_at,
            },
            usage: TokenUsage::default(),
        },
        Cleaning {
            title_cut,
            summary_cut,
            facts_dropped,
            entities_dropped,
        },
    ))
}

/// The answer's title on one line within [`MAX_TITLE_CHARS`], and its summary within a
/// memory's text; each with whether it was cut. Malformed when either has nothing visible.
#[expect(
    clippy::type_complexity,
    reason = "two texts, each with whether it was cut"
)]
fn cleaned_title_and_summary(
    title: &str,
    summary: &str,
    max_text_chars: usize,
) -> Result<((String, bool), (String, bool)), LlmError> {
    let malformed = |error: ValidationError| LlmError::Malformed(format!("the answer's {error}"));
    let (title, title_cut) = cleaned_within(title, MAX_TITLE_CHARS);
    let title = title.split_whitespace().collect::<Vec<_>>().join(" ");
    check_label("title", &title, MAX_TITLE_CHARS).map_err(malformed)?;
    let (summary, summary_cut) = cleaned_within(summary, max_text_chars);
    let summary = MemoryText::parse("summary", &summary, max_text_chars)
        .map_err(malformed)?
        .into_string();
    Ok(((title, title_cut), (summary, summary_cut)))
}

/// `raw` without what steers a display, trimmed, within `max_chars` characters: cut at a word
/// and ended with "…" when longer (and `true`). Only the first [`READ_BEYOND_LIMIT`] times
/// `max_chars` characters are read; a text longer than that is cut, whatever it held.
fn cleaned_within(raw: &str, max_chars: usize) -> (String, bool) {
    let (read, unread) = match raw
        .char_indices()
        .nth(max_chars.saturating_mul(READ_BEYOND_LIMIT))
    {
        Some((end, _)) => (&raw[..end], true),
        None => (raw, false),
    };
    let cleaned = strip_steering(read);
    let cleaned = cleaned.trim();
    let chars = cleaned.chars().count();
    if chars > max_chars {
        (truncate_at_word(cleaned, max_chars), true)
    } else if unread {
        // Mostly controls, and more unread: what was read, marked as cut.
        (truncate_at_word(cleaned, chars.saturating_sub(1)), true)
    } else {
        (cleaned.to_owned(), false)
    }
}

/// The items of one list that are a memory's text once cleaned (each with the turn it cites),
/// and how many were not.
fn cleaned_facts(items: Vec<Said>, max_chars: usize) -> (Vec<(String, Option<i64>)>, usize) {
    let mut kept = Vec::with_capacity(items.len());
    let mut dropped = 0;
    for item in items {
        let (item, turn) = item.into_parts();
        if item.len() > max_chars.saturating_mul(MAX_UTF8_BYTES) {
            dropped += 1;
            continue;
        }
        match MemoryText::parse("fact", strip_steering(&item).trim(), max_chars) {
            Ok(text) => kept.push((text.into_string(), turn)),
            Err(_) => dropped += 1,
        }
    }
    (kept, dropped)
}

/// Keeps at most `max` items of the lists in all, one of each list in turn, so that a list of
/// hundreds cannot crowd out the others; returns how many were left out.
fn keep_in_turn<T>(lists: &mut [Vec<T>], max: usize) -> usize {
    let total: usize = lists.iter().map(Vec::len).sum();
    if total <= max {
        return 0;
    }
    let mut keep = vec![0; lists.len()];
    let mut kept = 0;
    while kept < max {
        for (list, keep) in lists.iter().zip(keep.iter_mut()) {
            if kept < max && *keep < list.len() {
                *keep += 1;
                kept += 1;
            }
        }
    }
    for (list, keep) in lists.iter_mut().zip(keep) {
        list.truncate(keep);
    }
    total - max
}

/// The entities that are tags once cleaned (on one line, within [`MAX_TAG_CHARS`]), each once,
/// at most [`MAX_ENTITIES`]; and how many were left out.
fn cleaned_entities(items: Vec<String>) -> (Vec<String>, usize) {
    let mut kept: Vec<String> = Vec::new();
    let mut dropped = 0;
    for item in items {
        if kept.len() == MAX_ENTITIES || item.len() > MAX_TAG_CHARS * MAX_UTF8_BYTES {
            dropped += 1;
            continue;
        }
        let name = strip_steering(&item)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if check_label("entity", &name, MAX_TAG_CHARS).is_err() || kept.contains(&name) {
            dropped += 1;
            continue;
        }
        kept.push(name);
    }
    (kept, dropped)
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

    const MAX_TEXT: usize = 8_192;

    fn answer(title: &str, summary: &str, established: StructuredSummary) -> Answer {
        let bare = |items: Vec<String>| items.into_iter().map(Said::Bare).collect();
        Answer {
            title: title.into(),
            summary: summary.into(),
            surprise: 0.5,
            established: Established {
                facts: bare(established.facts),
                preferences: bare(established.preferences),
                decisions: bare(established.decisions),
                todos: bare(established.todos),
                goals: bare(established.goals),
                experiences: bare(established.experiences),
                guidelines: bare(established.guidelines),
                entities: established.entities,
            },
        }
    }

    #[test]
    fn items_hold_from_the_turn_they_cite_and_a_missing_list_reads_as_empty() {
        let answer: Answer = serde_json::from_value(serde_json::json!({
            "title": "Nate's move",
            "summary": "Nate moved to Lisbon and sold his van.",
            "surprise": 0.6,
            "established": {
                "facts": [
                    {"text": "Nate: I live in Lisbon now.", "turn": 2},
                    {"text": "Nate: I sold the van.", "turn": 9},
                    "Nate: I work nights."
                ],
                "guidelines": [{"text": "Use metric units.", "turn": 1}]
            }
        }))
        .unwrap();
        let first = DateTime::parse_from_rfc3339("2026-03-01T10:00:00Z")
            .unwrap()
            .to_utc();
        let second = first + chrono::Duration::minutes(3);
        let (episode, _) = episode_of(answer, &[first, second], MAX_TEXT).unwrap();
        let structured = &episode.structured;
        assert_eq!(structured.facts.len(), 3);
        assert_eq!(structured.guidelines, ["Use metric units."]);
        assert!(structured.facts_are_plain, "each kind has its own list");
        assert_eq!(
            structured.said_at.get("Nate: I live in Lisbon now."),
            Some(&second)
        );
        assert_eq!(structured.said_at.get("Use metric units."), Some(&first));
        // A turn the segment does not have, or none cited: from the episode's end.
        assert_eq!(structured.said_at.get("Nate: I sold the van."), None);
        assert_eq!(structured.said_at.get("Nate: I work nights."), None);
    }

    #[test]
    fn nul_and_other_controls_are_removed_from_every_text() {
        let (episode, cleaning) = episode_of(
            answer(
                "Deploy\u{0}\u{1b}[31m plans\n for Friday",
                "The user\u{0} ships\u{202e} on Friday.\r\nThen rests.",
                StructuredSummary {
                    facts: vec!["The user ships\u{0} on Friday.".into()],
                    todos: vec!["\u{0}\u{7}".into()],
                    entities: vec!["Acme\u{0} Robotics".into(), "\tAcme  Robotics ".into()],
                    ..StructuredSummary::default()
                },
            ),
            &[],
            MAX_TEXT,
        )
        .unwrap();
        assert_eq!(episode.title, "Deploy plans for Friday");
        assert_eq!(episode.summary, "The user ships on Friday.\nThen rests.");
        assert_eq!(episode.structured.facts, ["The user ships on Friday."]);
        assert!(episode.structured.todos.is_empty(), "nothing left of it");
        assert_eq!(episode.structured.entities, ["Acme Robotics"]);
        assert_eq!(
            cleaning,
            Cleaning {
                facts_dropped: 1,
                entities_dropped: 1,
                ..Cleaning::default()
            }
        );
    }

    #[test]
    fn a_title_or_summary_of_nothing_visible_is_malformed() {
        for (title, summary) in [("\u{0}\u{1b}[2J", "A summary."), ("A title", " \u{0} ")] {
            let error = episode_of(
                answer(title, summary, StructuredSummary::default()),
                &[],
                MAX_TEXT,
            )
            .unwrap_err();
            assert!(matches!(error, LlmError::Malformed(_)), "{error}");
        }
        let mut nan = answer("A title", "A summary.", StructuredSummary::default());
        nan.surprise = f64::NAN;
        assert!(episode_of(nan, &[], MAX_TEXT).is_err());
    }

    #[test]
    fn absurd_lengths_are_cut_or_left_out() {
        let long_fact = format!("The user {}.", "really ".repeat(2_000));
        let (episode, cleaning) = episode_of(
            answer(
                &"title ".repeat(20_000),
                &"word ".repeat(210_000),
                StructuredSummary {
                    facts: vec![long_fact, "The user likes tea.".into()],
                    entities: vec!["x".repeat(208), "y".repeat(MAX_TAG_CHARS)],
                    ..StructuredSummary::default()
                },
            ),
            &[],
            MAX_TEXT,
        )
        .unwrap();
        assert!(episode.title.chars().count() <= MAX_TITLE_CHARS);
        assert!(episode.title.starts_with("title title") && episode.title.ends_with('…'));
        assert!(episode.summary.chars().count() <= MAX_TEXT);
        assert!(episode.summary.ends_with('…'));
        assert_eq!(episode.structured.facts, ["The user likes tea."]);
        assert_eq!(episode.structured.entities, ["y".repeat(MAX_TAG_CHARS)]);
        assert_eq!(
            cleaning,
            Cleaning {
                title_cut: true,
                summary_cut: true,
                facts_dropped: 1,
                entities_dropped: 1,
            }
        );
    }

    #[test]
    fn a_text_of_mostly_controls_beyond_what_is_read_is_cut() {
        let raw = format!("Title{}", "\u{7}".repeat(4 * MAX_TITLE_CHARS));
        let (title, cut) = cleaned_within(&raw, MAX_TITLE_CHARS);
        assert!(cut);
        assert!(
            title.ends_with('…') && title.chars().count() <= 5,
            "{title}"
        );
        assert_eq!(
            cleaned_within(" Short\u{0} ", 10),
            ("Short".to_owned(), false)
        );
    }

    #[test]
    fn a_flood_of_facts_is_capped_one_kind_at_a_time() {
        let flood: Vec<String> = (0..2_000).map(|n| format!("Fact number {n}.")).collect();
        let (episode, cleaning) = episode_of(
            answer(
                "Flood",
                "Many facts.",
                StructuredSummary {
                    facts: flood,
                    preferences: vec!["The user prefers tea.".into()],
                    goals: vec!["Run a marathon.".into(), "Learn Rust.".into()],
                    entities: (0..40).map(|n| format!("Entity {n}")).collect(),
                    ..StructuredSummary::default()
                },
            ),
            &[],
            MAX_TEXT,
        )
        .unwrap();
        let structured = &episode.structured;
        assert_eq!(structured.preferences, ["The user prefers tea."]);
        assert_eq!(structured.goals, ["Run a marathon.", "Learn Rust."]);
        assert_eq!(structured.facts.len(), MAX_FACTS_PER_SEGMENT - 3);
        assert_eq!(structured.facts[0], "Fact number 0.", "in the order given");
        assert_eq!(cleaning.facts_dropped, 2_003 - MAX_FACTS_PER_SEGMENT);
        assert_eq!(structured.entities.len(), MAX_ENTITIES);
        assert_eq!(cleaning.entities_dropped, 40 - MAX_ENTITIES);
    }

    #[test]
    fn keeping_in_turn_leaves_short_lists_whole() {
        let mut lists = [vec!["a".to_owned(); 3], vec![], vec!["b".to_owned(); 10]];
        assert_eq!(keep_in_turn(&mut lists, 20), 0);
        assert_eq!(keep_in_turn(&mut lists, 5), 8);
        assert_eq!(lists.map(|list| list.len()), [3, 0, 2]);
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
