//! What a forgotten fact leaves behind elsewhere, found and cut out: the sentences of episode
//! summaries, excerpts and stored turns that say it (issue 39: after "forget that", no table may
//! still hold the locker code).
//!
//! A sentence says the forgotten fact when, compared as fingerprints are (lowercase, words
//! folded), it holds the fact's statement ("Remember that my locker code at the office is 4312."
//! holds "my locker code at the office is 4312"), or the fact holds it (a summary that kept a
//! shorter form), or it names one of the fact's distinctive tokens: a number of four digits or
//! more that is no year, an e-mail address, a code mixing letters and digits ("4312",
//! "x7-alpha9"). Those must not survive even in a sentence cut short ("… locker code is 4312
//! and the…").

use crate::episode::{StructuredSummary, sentences};
use crate::normalize::normalize_for_fingerprint;

/// What was forgotten, ready to be looked for.
#[derive(Debug, Clone)]
pub struct Forgotten {
    /// The statement, fingerprint-normalised, without a speaker label or a "remember that".
    statement: String,
    /// Tokens that identify it on their own (see the module documentation), lowercased.
    distinctive: Vec<String>,
}

/// A shorter sentence than this (normalised characters) is never taken for the fact because the
/// fact holds it ("yes", "ok").
const MIN_HELD_SENTENCE_CHARS: usize = 12;

impl Forgotten {
    /// The forgotten text as the fact stored it ("Nate: my locker code is 4312.").
    pub fn new(text: &str) -> Self {
        let said = crate::speaker::split_speaker(text).map_or(text, |(_, said)| said);
        let statement = normalize_for_fingerprint(said);
        let statement = strip_command(&statement).to_owned();
        let distinctive = said
            .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '，' | '；' | '(' | ')'))
            .map(|token| token.trim_matches(|c: char| !c.is_alphanumeric() && c != '@'))
            .filter(|token| is_distinctive(token))
            .map(str::to_lowercase)
            .collect();
        Self {
            statement,
            distinctive,
        }
    }

    /// Strings whose presence (any case) marks a text that may hold the forgotten fact: what a
    /// store narrows its search by before [`Forgotten::redact`] decides.
    pub fn needles(&self) -> Vec<String> {
        let mut needles = self.distinctive.clone();
        if needles.is_empty() && !self.statement.is_empty() {
            // The statement's longest word stands for it: an exact phrase would miss a text
            // spaced or cased differently.
            if let Some(word) = self
                .statement
                .split_whitespace()
                .max_by_key(|word| word.chars().count())
            {
                needles.push(word.to_owned());
            }
        }
        needles
    }

    /// Whether a sentence says the forgotten fact.
    pub fn said_in(&self, sentence: &str) -> bool {
        if self.statement.is_empty() {
            return false;
        }
        let normalized = normalize_for_fingerprint(sentence);
        let normalized = strip_command(&normalized);
        if normalized.contains(self.statement.as_str())
            || (normalized.chars().count() >= MIN_HELD_SENTENCE_CHARS
                && self.statement.contains(normalized))
        {
            return true;
        }
        let lower = sentence.to_lowercase();
        self.distinctive.iter().any(|token| {
            lower.match_indices(token.as_str()).any(|(at, _)| {
                let before = lower[..at].chars().next_back();
                let after = lower[at + token.len()..].chars().next();
                before.is_none_or(|c| !c.is_alphanumeric())
                    && after.is_none_or(|c| !c.is_alphanumeric())
            })
        })
    }

    /// `text` without the sentences that say the forgotten fact, or `None` when it says nothing
    /// of it. What is left keeps its sentences in order, joined by a space (or by a line break
    /// where the text had lines); nothing left is an empty string.
    pub fn redact(&self, text: &str) -> Option<String> {
        let all = sentences(text);
        let kept: Vec<&str> = all
            .iter()
            .copied()
            .filter(|sentence| !self.said_in(sentence))
            .collect();
        if kept.len() == all.len() {
            return None;
        }
        let separator = if text.contains('\n') { "\n" } else { " " };
        Some(kept.join(separator))
    }

    /// Whether a short label (a tag, an entity, a title word) is part of what was forgotten.
    pub fn covers_label(&self, label: &str) -> bool {
        let label = label.trim().to_lowercase();
        !label.is_empty()
            && (self.distinctive.contains(&label)
                || (label.chars().count() >= 3
                    && label.chars().any(char::is_numeric)
                    && self.statement.contains(&label)))
    }
}

/// What stands where every sentence of a text was forgotten (a turn, a summary, a line of an
/// excerpt): the row stays, so the conversation keeps its turns in order.
pub const FORGOTTEN_MARK: &str = "[forgotten]";

impl Forgotten {
    /// `text` redacted for a place that may not be empty: [`FORGOTTEN_MARK`] where nothing is
    /// left; `None` when it says nothing of the fact.
    pub fn redact_or_mark(&self, text: &str) -> Option<String> {
        self.redact(text).map(|rest| {
            if rest.trim().is_empty() {
                FORGOTTEN_MARK.to_owned()
            } else {
                rest
            }
        })
    }

    /// Redacts each line of an episode's excerpt in place; whether any said the fact.
    pub fn redact_lines(&self, lines: &mut [String]) -> bool {
        let mut changed = false;
        for line in lines {
            if let Some(rest) = self.redact_or_mark(line) {
                *line = rest;
                changed = true;
            }
        }
        changed
    }

    /// Drops from a structured summary the items that say the fact (and the entities and times
    /// naming it); whether any did.
    pub fn redact_structured(&self, summary: &mut StructuredSummary) -> bool {
        let before = summary.clone();
        for list in [
            &mut summary.facts,
            &mut summary.preferences,
            &mut summary.decisions,
            &mut summary.todos,
            &mut summary.goals,
            &mut summary.experiences,
            &mut summary.guidelines,
        ] {
            list.retain(|item| !self.said_in(item));
        }
        summary.entities.retain(|entity| !self.covers_label(entity));
        summary.said_at.retain(|item, _| !self.said_in(item));
        *summary != before
    }

    /// Drops the labels (tags) that are part of the fact; whether any was.
    pub fn drop_labels(&self, labels: &mut Vec<String>) -> bool {
        let before = labels.len();
        labels.retain(|label| !self.covers_label(label));
        labels.len() != before
    }
}

/// A fact written from a memory command keeps the command's words out; its sentence in a turn
/// or a summary has them ("remember that …", "记住…").
fn strip_command(normalized: &str) -> &str {
    for prefix in [
        "remember that ",
        "please remember that ",
        "remember ",
        "note down that ",
        "记住",
        "记一下",
        "记下",
    ] {
        if let Some(rest) = normalized.strip_prefix(prefix) {
            return rest.trim_start();
        }
    }
    normalized
}

/// A token that identifies a fact on its own: a number of four digits or more (no year), an
/// e-mail address, or a code of letters and digits.
fn is_distinctive(token: &str) -> bool {
    let digits = token.chars().filter(char::is_ascii_digit).count();
    let letters = token.chars().filter(|c| c.is_alphabetic()).count();
    // A year names a time, not the fact: "in 2024" is said of many things.
    let year = digits == 4
        && token.chars().count() == 4
        && (token.starts_with("19") || token.starts_with("20"));
    (token.contains('@') && token.contains('.'))
        || (digits >= 4 && letters == 0 && !year)
        || (digits >= 2 && letters >= 1 && token.chars().count() >= 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentences_saying_the_fact_are_cut_and_the_rest_kept() {
        let forgotten = Forgotten::new("My locker code at the office is 4312.");
        assert_eq!(
            forgotten
                .redact(
                    "We sorted the Monday rota. Remember that my locker code at the office is \
                     4312. Then we talked about lunch."
                )
                .as_deref(),
            Some("We sorted the Monday rota. Then we talked about lunch.")
        );
        // A summary cut short still names the code.
        assert_eq!(
            forgotten.redact("The code is 4312 and the").as_deref(),
            Some("")
        );
        assert_eq!(forgotten.redact("We sorted the Monday rota."), None);
        assert_eq!(
            forgotten.redact("Room 43120 is upstairs."),
            None,
            "whole tokens"
        );
        assert!(forgotten.covers_label("4312"));
        assert!(!forgotten.covers_label("office"));
        assert_eq!(forgotten.needles(), ["4312"]);
    }

    #[test]
    fn an_episode_loses_the_lines_items_and_tags_that_say_it() {
        let forgotten = Forgotten::new("My locker code at the office is 4312.");
        let mut lines = vec![
            "Remember that my locker code at the office is 4312.".to_owned(),
            "Saved to memory.".to_owned(),
        ];
        assert!(forgotten.redact_lines(&mut lines));
        assert_eq!(lines, [FORGOTTEN_MARK, "Saved to memory."]);
        let mut structured = StructuredSummary {
            facts: vec![
                "My locker code at the office is 4312.".to_owned(),
                "I work in Leeds.".to_owned(),
            ],
            entities: vec!["4312".to_owned(), "leeds".to_owned()],
            ..StructuredSummary::default()
        };
        assert!(forgotten.redact_structured(&mut structured));
        assert_eq!(structured.facts, ["I work in Leeds."]);
        assert_eq!(structured.entities, ["leeds"]);
        let mut tags = vec!["4312".to_owned(), "office".to_owned()];
        assert!(forgotten.drop_labels(&mut tags));
        assert_eq!(tags, ["office"]);
    }

    #[test]
    fn a_named_speakers_fact_and_chinese_are_found_too() {
        let forgotten = Forgotten::new("Nate: I'm allergic to sesame.");
        assert!(forgotten.said_in("Honestly, I'm allergic to sesame."));
        assert!(!forgotten.said_in("I'm allergic to cats."));
        let chinese = Forgotten::new("我的门禁密码是 8823。");
        assert_eq!(
            chinese.redact("记住我的门禁密码是 8823。谢谢！").as_deref(),
            Some("谢谢！")
        );
    }
}
