//! The local fallback that turns a closed conversation segment into an episodic memory (title,
//! summary, structured summary) and semantic facts when no LLM is configured. It runs by default,
//! so it is built for real chat text in English and Chinese: greetings, lowercase typing, Markdown
//! answers with code blocks, Chinese typed with ASCII punctuation.
//!
//! The approach is extractive: nothing is written that the conversation did not say.
//!
//! - Sentences are split on `.` `!` `?`, their CJK forms, line breaks and `"; "`, minding decimal
//!   numbers, domains and common abbreviations; fenced code blocks and system turns are left out,
//!   and a leading "Hi," or "谢谢，" is dropped from a sentence.
//! - Terms are content words (a small English stop-word list removes function words and chat
//!   filler) and, for CJK text, character bigrams without pronouns or particles. A term's salience
//!   is its frequency over the segment (a user's use counts 1.5) times `ln(1 + n / df)`, which
//!   weighs down what most sentences say.
//! - The summary keeps the best-scoring sentences whole, in their original order, up to
//!   [`MAX_SUMMARY_CHARS`]: user sentences and sentences with a category signal weigh more;
//!   chit-chat, closing pleasantries, memory commands, short questions and the assistant's
//!   questions are left out.
//! - The title is a short phrase naming the topic: the clause of the first statement that says
//!   the most salient keyphrase, without its fillers and first-person subject, cut to a few
//!   words around it ("Moved to Lisbon last month"). Keyphrases are content words, and runs of
//!   two or three of them that recur ("JR Pass", "borrow checker"), with named entities found by
//!   [`metadata::extract`] in user turns weighed up; where no clause reads as a headline, the
//!   title lists the best ones. Chinese has no spaces to find phrases by, so a Chinese title is
//!   the opening clause of the first substantive user sentence.
//! - Facts are the lasting statements a speaker makes about themselves
//!   ([`crate::statement::lasting_statement`]: who they are, what they have, like, did, aim for,
//!   decided or must do; reactions, compliments, vague maybes, hypotheticals and talk about the
//!   conversation itself are not), with a few local additions (Chinese wishes and dated plans,
//!   "always/never …" instructions, "my X is Y"); their keywords are metadata tags. In a chat
//!   only the user's statements are facts, and only the user's to the assistant are guidelines;
//!   where the turns name their speakers ("Nate: …"), every speaker's statements are facts about
//!   them, stored with their name ("Nate: I love coconut milk.").
//! - Entities are metadata tags of each turn, ranked by how many turns name them and by salience;
//!   for Chinese, where metadata finds little, CJK phrases that recur join them.
//!
//! Limits, compared with what an LLM summary gives: the summary is quoted rather than written,
//! so it stays in the speakers' first and second person ("I prefer…", not "the user prefers…"),
//! cannot merge what several turns said into one statement, resolve "it" or "that" to what they
//! refer to, notice that a later turn retracted an earlier one, or tell a hypothetical from a real
//! plan. Facts are found only where a rule recognises the phrasing: a fact said in a way no rule
//! knows is missed, and a sentence that merely sounds like one may be kept. Titles are lists of
//! keyphrases (or, in Chinese, a clause), not a description of what happened; entities of Chinese
//! text are recurring character sequences, not recognised names.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::LazyLock;

use chrono::{DateTime, Utc};

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::category::{Category, SpeakerRole};
use crate::commands::{MemoryCommand, parse_command};
use crate::importance::{infer_category, is_chit_chat};
use crate::metadata;
use crate::normalize::{is_cjk, normalize_for_fingerprint};
use crate::speaker::split_speaker;
use crate::statement::{is_passing, lasting_statement};

/// One turn of a closed segment.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentTurn {
    pub role: SpeakerRole,
    pub content: String,
}

/// What a segment established, as the structured summary stores it. All lists may be empty, and
/// a list missing from a stored (or an LLM's) summary reads as empty.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StructuredSummary {
    /// Facts the speakers stated (an LLM's list may hold experiences and guidelines too: their
    /// category is then inferred from the text).
    pub facts: Vec<String>,
    pub preferences: Vec<String>,
    pub decisions: Vec<String>,
    pub todos: Vec<String>,
    pub goals: Vec<String>,
    /// What happened to a speaker (summaries stored before these lists existed have none).
    pub experiences: Vec<String>,
    /// How the user wants the assistant to behave.
    pub guidelines: Vec<String>,
    /// Whether `facts` holds plain facts alone, experiences and guidelines in their own lists
    /// (the local rules' summaries); an LLM's `facts` may mix them, so their kind is inferred.
    pub facts_are_plain: bool,
    /// The segment's most widely mentioned metadata tags (people, places, products, dates,
    /// keyphrases), lowercased.
    pub entities: Vec<String>,
    /// When each established text was said, where the describer knows the turn (the local
    /// rules do; an LLM's paraphrase has none): a fact holds from then, and a fact it supersedes
    /// ends then, not when the episode closed or was written.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub said_at: BTreeMap<String, DateTime<Utc>>,
}

impl StructuredSummary {
    /// What the segment established, each with its category, once each, in the order of the
    /// lists: the facts whose category is not given by their list are inferred from the text.
    pub fn established(&self) -> Vec<(String, Category)> {
        let plain = self.facts_are_plain.then_some(Category::Fact);
        let by_kind: [(&Vec<String>, Option<Category>); 7] = [
            (&self.facts, plain),
            (&self.preferences, Some(Category::Preference)),
            (&self.experiences, Some(Category::Experience)),
            (&self.guidelines, Some(Category::Guideline)),
            (&self.decisions, Some(Category::Decision)),
            (&self.todos, Some(Category::Todo)),
            (&self.goals, Some(Category::Goal)),
        ];
        let mut established: Vec<(String, Category)> = Vec::new();
        for (texts, category) in by_kind {
            for text in texts {
                let text = text.trim();
                if text.is_empty() || established.iter().any(|(known, _)| known == text) {
                    continue;
                }
                let category = category.unwrap_or_else(|| infer_category(text));
                established.push((text.to_owned(), category));
            }
        }
        established
    }
}

/// A fact stated in the segment, ready to be written as a semantic memory.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtractedFact {
    /// The user's sentence, trimmed, ending in one full stop ("." or "。").
    pub text: String,
    pub category: Category,
    /// Metadata tags of the sentence, at most [`MAX_FACT_KEYWORDS`].
    pub keywords: Vec<String>,
    /// The segment turn it was said in (an index into the turns described).
    pub turn: usize,
}

/// The episodic memory of a segment, with the facts it established.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeDraft {
    pub title: String,
    pub summary: String,
    pub structured: StructuredSummary,
    pub facts: Vec<ExtractedFact>,
}

pub const MAX_TITLE_CHARS: usize = 80;
pub const MAX_SUMMARY_CHARS: usize = 480;
/// A fact keeps at most this many keywords.
pub const MAX_FACT_KEYWORDS: usize = 8;
/// The structured summary names at most this many entities.
pub const MAX_ENTITIES: usize = 12;
/// The title of a segment with no readable text at all.
pub const UNTITLED: &str = "Untitled conversation";

/// A user's words count this much more than the assistant's in salience and summary scores.
const USER_WEIGHT: f64 = 1.5;
/// A sentence with a category signal (preference, decision, todo ...) is what an episode is
/// remembered by.
const SIGNAL_WEIGHT: f64 = 1.3;
/// A question tells what the conversation was about, but less than a statement does.
const QUESTION_WEIGHT: f64 = 0.7;
/// The first substantive user sentence usually names the topic.
const OPENING_WEIGHT: f64 = 1.1;
/// Named entities (metadata tags of user turns) make better titles than common words.
const ENTITY_WEIGHT: f64 = 1.5;
/// Sentences scoring below this share of the best one are not worth summary space.
const SUMMARY_SCORE_FLOOR: f64 = 0.2;
/// Keyphrases scoring below this share of the best one stay out of the title.
const TITLE_SCORE_FLOOR: f64 = 0.35;
const MAX_TITLE_PHRASES: usize = 3;
const MAX_PHRASE_WORDS: usize = 3;
/// A run of several words is a name ("JR Pass", "log parser") once it recurs: said twice, or by
/// both sides. A one-off run ("checks indexes exist") is more often a clause.
const MIN_PHRASE_OCCURRENCES: f64 = 2.0;
/// Questions shorter than this (words; CJK characters count half a word) are not summarised.
const MIN_SUMMARY_QUESTION_WORDS: usize = 5;
/// A Chinese title is a clause of at most this many characters.
const MAX_CJK_TITLE_CHARS: usize = 20;
/// The longest sentence (in bytes: 1,000 characters of English, about 330 of Chinese) that may
/// be a fact.
const MAX_STATEMENT_BYTES: usize = 1_000;
/// The share of a segment's turns that must carry a person's label for its speakers to be
/// named, when two or more people speak.
const NAMED_TURNS_SHARE: f64 = 0.8;

/// The extractive episode of a segment: title, summary, structured summary and facts.
///
/// A segment of nothing but chit-chat ("hi", "thanks") gives its first user sentence as the
/// title ("Hi"), those sentences joined as the summary (so the episode still says what happened),
/// no facts and an empty structured summary. A segment without any letter or digit gives
/// [`UNTITLED`] and an empty summary.
pub fn extractive_episode(turns: &[SegmentTurn]) -> EpisodeDraft {
    let units = segment_units(turns);
    let salience = Salience::of(&units);
    let scores: Vec<f64> = units
        .iter()
        .map(|unit| unit_score(unit, &salience))
        .collect();
    let tags = SegmentTags::of(&units, &salience);

    let summary = summary(&units, &scores);
    let title = title(&units, &scores, &salience, &tags.user_tags);
    let facts = facts_of(&units);

    let mut structured = StructuredSummary {
        entities: tags.entities,
        facts_are_plain: true,
        ..StructuredSummary::default()
    };
    for fact in &facts {
        let list = match fact.category {
            Category::Preference => &mut structured.preferences,
            Category::Decision => &mut structured.decisions,
            Category::Todo => &mut structured.todos,
            Category::Goal => &mut structured.goals,
            Category::Experience => &mut structured.experiences,
            Category::Guideline => &mut structured.guidelines,
            Category::Fact => &mut structured.facts,
        };
        list.push(fact.text.clone());
    }

    EpisodeDraft {
        title,
        summary,
        structured,
        facts,
    }
}

/// Facts the user stated in these turns (user turns only), one per sentence that carries a
/// category signal or states a personal fact. Questions, memory commands ("remember that ...",
/// whose fact is written explicitly; "forget that"), chit-chat and sentences under three words
/// (four characters in CJK) are no facts; a repeated fact is kept once, where it was first said.
pub fn extract_facts(turns: &[SegmentTurn]) -> Vec<ExtractedFact> {
    let user_turns: Vec<SegmentTurn> = turns
        .iter()
        .filter(|turn| turn.role == SpeakerRole::User)
        .cloned()
        .collect();
    facts_of(&segment_units(&user_turns))
}

/// Sentences of a text: split on `.` `!` `?` and their CJK forms (`。！？`, and `；`), on line
/// breaks and on `"; "`, but not inside numbers (9.30), domains (example.com) or abbreviations
/// ("e.g.", "Dr.", "U.S." before a lowercase word). Sentences are trimmed, list markers ("- ",
/// "1. ", "## ") are dropped from their start, and pieces without a letter or digit (stray
/// punctuation, a lone emoji) are dropped.
pub fn sentences(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((index, c)) = chars.next() {
        match c {
            '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}' => {
                push_sentence(&mut found, &text[start..index]);
                start = index + c.len_utf8();
            }
            ';' => {
                let next = chars.peek().map(|&(_, next)| next);
                if next.is_none_or(char::is_whitespace) {
                    push_sentence(&mut found, &text[start..index]);
                    start = index + c.len_utf8();
                }
            }
            '.' | '!' | '?' | '…' | '。' | '！' | '？' | '；' => {
                let mut run = TerminatorRun::default();
                run.add(c);
                let mut end = index + c.len_utf8();
                // "?!", "...", and the quotes or brackets closing the sentence: `He said "go."`.
                let mut closed = false;
                while let Some(&(next_index, next)) = chars.peek() {
                    if is_terminator(next) && !closed {
                        run.add(next);
                    } else if is_closing_mark(next) {
                        closed = true;
                    } else {
                        break;
                    }
                    end = next_index + next.len_utf8();
                    chars.next();
                }
                let rest = &text[end..];
                if ends_sentence(&text[start..index], &run, rest) {
                    push_sentence(&mut found, &text[start..end]);
                    start = end;
                }
            }
            _ => {}
        }
    }
    push_sentence(&mut found, &text[start..]);
    found
}

// ---------------------------------------------------------------------------------------------
// Sentence splitting

/// The terminators ending a sentence, with the closing quotes and brackets that follow them.
#[derive(Debug, Default)]
struct TerminatorRun {
    full_width: bool,
    exclamation_or_question: bool,
    dots: usize,
    ellipsis: bool,
}

impl TerminatorRun {
    fn add(&mut self, c: char) {
        match c {
            '。' | '！' | '？' | '；' => self.full_width = true,
            '!' | '?' => self.exclamation_or_question = true,
            '.' => self.dots += 1,
            _ => self.ellipsis = true,
        }
    }
}

fn is_closing_mark(c: char) -> bool {
    matches!(
        c,
        ')' | ']' | '}' | '"' | '\'' | '”' | '’' | '」' | '』' | '）' | '】' | '》'
    )
}

fn is_terminator(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | '…' | '。' | '！' | '？' | '；')
}

/// Whether a run of terminators after `before` (the sentence so far) ends the sentence, given
/// the text that follows.
fn ends_sentence(before: &str, run: &TerminatorRun, rest: &str) -> bool {
    if run.full_width {
        return true;
    }
    let Some(next) = rest.chars().next() else {
        return true;
    };
    // "9.30", "example.com", "U.S" inside a token: no sentence ends without a space, except
    // in Chinese typed with ASCII punctuation ("我喜欢茶!你呢?"); "query!宏" is a macro name.
    let between_cjk = is_cjk(next) && before.chars().last().is_some_and(is_cjk);
    if !(next.is_whitespace() || between_cjk) {
        return false;
    }
    if run.exclamation_or_question || run.ellipsis || run.dots > 1 {
        return true;
    }
    !is_abbreviation(before, rest)
}

/// Abbreviations that never end a sentence: titles before a name, and Latin references
/// ("e.g. Python" is no sentence break).
#[rustfmt::skip]
const NEVER_FINAL_ABBREVIATIONS: &[&str] = &[
    "dr", "mr", "mrs", "ms", "mx", "prof", "st", "jr", "sr", "mt", "rev", "gen", "col", "capt",
    "lt", "sgt", "fig", "vol", "ch", "pp", "e.g", "i.e", "eg", "cf", "vs", "viz", "approx", "incl",
    "esp", "ca", "al", "dept", "est",
];

/// Abbreviations that may end a sentence ("at 9 a.m. We left"): a break only when a typical
/// sentence opening follows.
#[rustfmt::skip]
const MAYBE_FINAL_ABBREVIATIONS: &[&str] = &[
    "etc", "a.m", "p.m", "inc", "ltd", "co", "corp", "jan", "feb", "mar", "apr", "jun", "jul",
    "aug", "sep", "sept", "oct", "nov", "dec", "ph.d", "b.sc", "m.sc",
];

/// Words that typically open an English sentence, capitalised.
#[rustfmt::skip]
const SENTENCE_OPENERS: &[&str] = &[
    "i", "i'm", "i've", "i'll", "i'd", "my", "we", "we're", "we'll", "our", "the", "it", "it's",
    "this", "that", "these", "those", "he", "she", "they", "then", "but", "and", "so", "also",
    "you", "your", "there", "what", "how", "why", "when", "where", "who", "can", "do", "please",
    "let's", "a", "an", "in", "on", "at", "if", "after", "before", "now", "today", "tomorrow",
    "yesterday", "next", "last", "however", "still", "maybe", "thanks", "ok", "okay", "yes", "no",
];

fn is_abbreviation(before: &str, rest: &str) -> bool {
    let token = before
        .rsplit(char::is_whitespace)
        .next()
        .unwrap_or_default()
        .trim_start_matches(['(', '[', '"', '\'', '“', '‘', '「']);
    // "1. Buy milk", "a. first option": a list marker, not a sentence.
    if before.trim() == token {
        let is_number = !token.is_empty()
            && token.chars().count() <= 3
            && token.chars().all(|c| c.is_ascii_digit());
        let is_letter = token.chars().count() == 1 && token.chars().all(char::is_alphabetic);
        if is_number || is_letter {
            return true;
        }
    }
    let lower = token.to_lowercase();
    let next_word: &str = rest
        .trim_start()
        .split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’'))
        .next()
        .unwrap_or_default();
    if NEVER_FINAL_ABBREVIATIONS.contains(&lower.as_str()) {
        return true;
    }
    if lower == "no" {
        // "No. 5" is a number; "I said no. Then" ends.
        return next_word.starts_with(|c: char| c.is_ascii_digit());
    }
    let single_initial =
        token.chars().count() == 1 && token.chars().all(char::is_uppercase) && token != "I";
    if MAYBE_FINAL_ABBREVIATIONS.contains(&lower.as_str())
        || is_dotted_initials(&lower)
        || single_initial
    {
        let rest_start = rest.trim_start().chars().next();
        if rest_start.is_some_and(is_cjk) {
            return false;
        }
        let opens_sentence = next_word.starts_with(char::is_uppercase)
            && SENTENCE_OPENERS.contains(&next_word.to_lowercase().replace('’', "'").as_str());
        return !opens_sentence;
    }
    false
}

/// "u.s", "u.s.a", "p.m": single letters joined by dots (the final dot is the terminator).
fn is_dotted_initials(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|part| part.chars().count() == 1 && part.chars().all(char::is_alphabetic))
}

/// List markers and Markdown block prefixes at the start of a sentence.
static LIST_MARKER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:[-*+•·▪►>]+|\d{1,3}[.)]|[a-z][.)]|\(\d{1,3}\)|#{1,6})[ \t]+")
        .expect("valid list marker regex")
});

fn push_sentence<'a>(found: &mut Vec<&'a str>, piece: &'a str) {
    let mut sentence = piece.trim();
    // "- 1. item" and "> - quote" nest markers.
    while let Some(marker) = LIST_MARKER.find(sentence) {
        sentence = sentence[marker.end()..].trim_start();
    }
    if sentence.chars().any(char::is_alphanumeric) {
        found.push(sentence);
    }
}

/// The parts of a message outside fenced code blocks: code is no prose to summarise.
fn prose_regions(content: &str) -> Vec<&str> {
    let mut regions = Vec::new();
    let mut in_code = false;
    let mut region_start = 0;
    let mut offset = 0;
    for line in content.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            if !in_code && region_start < offset {
                regions.push(&content[region_start..offset]);
            }
            in_code = !in_code;
            region_start = offset + line.len();
        }
        offset += line.len();
    }
    if !in_code && region_start < content.len() {
        regions.push(&content[region_start..]);
    }
    regions
}

// ---------------------------------------------------------------------------------------------
// Terms

/// A word (letters and digits, joined across inner `-`, `'`, `.` and `_`, as in "two-week",
/// "don't", "node.js") or one CJK character, as byte offsets into the text.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Span {
    start: usize,
    end: usize,
    cjk: bool,
}

/// Splits text into words and CJK characters, like [`crate::normalize::tokenize`], but with
/// offsets (keyphrases keep their original spelling) and compounds kept whole.
fn spans(text: &str) -> Vec<Span> {
    let is_word_char = |c: char| c.is_alphanumeric() && !is_cjk(c);
    let mut found = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((index, c)) = chars.next() {
        if is_cjk(c) {
            found.push(Span {
                start: index,
                end: index + c.len_utf8(),
                cjk: true,
            });
            continue;
        }
        if !is_word_char(c) {
            continue;
        }
        let start = index;
        let mut end = index + c.len_utf8();
        while let Some(&(next_index, next)) = chars.peek() {
            if is_word_char(next) {
                end = next_index + next.len_utf8();
                chars.next();
            } else if matches!(next, '-' | '\'' | '’' | '.' | '_')
                && text[next_index + next.len_utf8()..]
                    .chars()
                    .next()
                    .is_some_and(is_word_char)
            {
                chars.next();
            } else if matches!(next, '+' | '#') && end - start == 1 {
                // "c++", "c#", "f#".
                end = next_index + next.len_utf8();
                chars.next();
                while let Some(&(plus_index, '+')) = chars.peek() {
                    end = plus_index + 1;
                    chars.next();
                }
                break;
            } else {
                break;
            }
        }
        // "Kyoto's" is about Kyoto.
        let word = &text[start..end];
        for possessive in ["'s", "’s"] {
            if word.len() > possessive.len() + 1 && word.ends_with(possessive) {
                end -= possessive.len();
            }
        }
        found.push(Span {
            start,
            end,
            cjk: false,
        });
    }
    found
}

/// A word as terms and stop words know it: lowercased, with a typographic apostrophe made
/// plain. Borrowed when the word already is (most chat words are).
fn word_key(word: &str) -> Cow<'_, str> {
    if word.chars().any(|c| c.is_uppercase() || c == '’') {
        Cow::Owned(word.to_lowercase().replace('’', "'"))
    } else {
        Cow::Borrowed(word)
    }
}

/// Function words and chat filler: no term of salience, and a break between keyphrases.
#[rustfmt::skip]
const STOP_WORDS: &[&str] = &[
    "a", "about", "above", "actually", "after", "again", "against", "ago", "all", "almost", "along",
    "already", "also", "although", "always", "am", "among", "an", "and", "another", "any", "anyone",
    "anything", "anyway", "are", "aren't", "around", "as", "ask", "asked", "at", "away", "awesome",
    "back", "be", "because", "been", "before", "being", "below", "best", "better", "between",
    "both", "but", "by", "can", "can't", "cannot", "certainly", "come", "could", "couldn't", "day",
    "days", "decide", "decided", "definitely", "did", "didn't", "dislike", "do", "does", "doesn't",
    "doing", "don't", "done", "down", "during", "e.g", "each", "easy", "either", "else", "enjoy",
    "enough", "etc", "even", "ever", "every", "exactly", "example", "feel", "few", "find", "first",
    "for", "forget", "found", "from", "fun", "further", "get", "gets", "getting", "give", "glad",
    "go", "goes", "going", "good", "got", "great", "had", "happy", "has", "hasn't", "hate", "have",
    "haven't", "having", "he", "he's", "hello", "help", "helped", "helpful", "helps", "her", "here",
    "here's", "hers", "herself", "hey", "hi", "him", "himself", "his", "hope", "how", "how's",
    "however", "http", "https", "i", "i'd", "i'll", "i'm", "i've", "i.e", "idea", "if", "important",
    "in", "into", "is", "isn't", "it", "it'd", "it'll", "it's", "its", "itself", "just", "keep",
    "kind", "know", "last", "least", "less", "let", "let's", "like", "likely", "little", "look",
    "looking", "lot", "lots", "love", "made", "make", "makes", "making", "many", "may", "maybe",
    "me", "mean", "might", "mine", "more", "most", "much", "must", "my", "myself", "need", "needs",
    "never", "new", "next", "nice", "no", "nor", "not", "nothing", "now", "of", "off", "often",
    "oh", "ok", "okay", "on", "once", "one", "ones", "only", "or", "other", "others", "our", "ours",
    "ourselves", "out", "over", "own", "perfect", "perhaps", "please", "plenty", "point", "prefer",
    "pretty", "probably", "quite", "rather", "really", "recommend", "remember", "right", "said",
    "same", "say", "says", "see", "seem", "seems", "several", "shall", "she", "she's", "should",
    "shouldn't", "since", "so", "some", "something", "sometimes", "soon", "sorry", "sound",
    "sounds", "still", "such", "suggest", "sure", "take", "tell", "than", "thank", "thanks", "that",
    "that'll", "that's", "the", "their", "theirs", "them", "themselves", "then", "there", "there's",
    "these", "they", "they'll", "they're", "thing", "things", "think", "this", "those", "though",
    "through", "tip", "tips", "to", "today", "tomorrow", "too", "try", "trying", "two", "under",
    "until", "up", "upon", "us", "use", "used", "using", "usually", "very", "via", "vs", "want",
    "wants", "was", "wasn't", "way", "ways", "we", "we'd", "we'll", "we're", "we've", "welcome",
    "well", "were", "weren't", "what", "what's", "whatever", "when", "where", "whether", "which",
    "while", "who", "whole", "whom", "whose", "why", "will", "with", "within", "without", "won't",
    "wonderful", "would", "wouldn't", "www", "yeah", "yes", "yesterday", "yet", "you", "you'd",
    "you'll", "you're", "you've", "your", "yours", "yourself", "yourselves",
];

static STOP_WORD_SET: LazyLock<HashSet<&'static str>> =
    LazyLock::new(|| STOP_WORDS.iter().copied().collect());

/// Whether a word (lowercased) can carry meaning: not a stop word, not a bare number, not a
/// single letter.
fn is_content_word(key: &str) -> bool {
    key.chars().count() >= 2 && key.chars().any(char::is_alphabetic) && !STOP_WORD_SET.contains(key)
}

/// CJK characters that are grammar rather than content: a bigram with one of them is no term.
const CJK_PARTICLES_AND_PRONOUNS: &str = "的了吗呢吧啊呀哦嗯么着过得地之我你您他她它们咱";
/// Common CJK characters that make a term only together with a content character.
const CJK_FUNCTION_CHARS: &str = concat!(
    "是在有和就也都这那不很要会说想去到把被给对让从与及或而且但所以因为如果还又再",
    "个些点能可以没太更最多少一二两三四五六七八九十几",
);
/// CJK bigrams as common as stop words.
#[rustfmt::skip]
const CJK_STOP_BIGRAMS: &[&str] = &[
    "喜欢", "觉得", "知道", "什么", "怎么", "没有", "一下", "现在", "但是", "还是",
    "就是", "这样", "那样", "应该", "需要", "打算", "希望", "比较", "非常", "真的",
    "一个", "这个", "那个", "自己", "时候", "问题", "谢谢", "你好", "不是", "可能",
    "已经", "然后", "一些", "一点", "有点", "其实", "当然", "如何", "为什", "建议",
    "推荐", "可以", "所以", "因为", "如果", "或者", "而且", "不过", "大约", "大概",
    "左右", "通常", "一般", "正好", "特别", "主要", "最好", "还有", "东西", "开始",
    "不用", "一带", "方便", "听起", "起来", "感觉", "地方", "情况", "方面", "之前",
    "之后", "以后", "以前", "今天", "明天", "昨天",
];

static CJK_PARTICLE_SET: LazyLock<HashSet<char>> =
    LazyLock::new(|| CJK_PARTICLES_AND_PRONOUNS.chars().collect());
static CJK_FUNCTION_SET: LazyLock<HashSet<char>> =
    LazyLock::new(|| CJK_FUNCTION_CHARS.chars().collect());
static CJK_STOP_BIGRAM_SET: LazyLock<HashSet<&'static str>> =
    LazyLock::new(|| CJK_STOP_BIGRAMS.iter().copied().collect());

fn is_cjk_term(bigram: &str) -> bool {
    if CJK_STOP_BIGRAM_SET.contains(bigram) {
        return false;
    }
    let mut function_chars = 0;
    for c in bigram.chars() {
        if CJK_PARTICLE_SET.contains(&c) {
            return false;
        }
        if CJK_FUNCTION_SET.contains(&c) {
            function_chars += 1;
        }
    }
    function_chars < 2
}

/// The distinct salient terms of a text — lowercased content words (no stop words) and CJK
/// bigrams (no particles or function characters) — as the summary weighs them; the review
/// grader compares a memory's with what the assistant said.
pub fn content_terms(text: &str) -> Vec<String> {
    let spans = spans(text);
    terms(text, &spans)
        .into_iter()
        .map(Cow::into_owned)
        .collect()
}

/// The distinct terms of a sentence: lowercased content words and CJK bigrams.
fn terms<'a>(text: &'a str, spans: &[Span]) -> Vec<Cow<'a, str>> {
    let mut found: Vec<Cow<'a, str>> = Vec::new();
    for (position, span) in spans.iter().enumerate() {
        if span.cjk {
            if let Some(next) = spans.get(position + 1)
                && next.cjk
                && next.start == span.end
            {
                let bigram = &text[span.start..next.end];
                if is_cjk_term(bigram) {
                    found.push(Cow::Borrowed(bigram));
                }
            }
        } else {
            let key = word_key(&text[span.start..span.end]);
            if is_content_word(&key) {
                found.push(key);
            }
        }
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// The number of words (other than CJK) and of CJK characters among a sentence's spans.
fn size(spans: &[Span]) -> (usize, usize) {
    let cjk = spans.iter().filter(|span| span.cjk).count();
    (spans.len() - cjk, cjk)
}

// ---------------------------------------------------------------------------------------------
// Sentence analysis

/// One sentence of the segment, analysed once for the summary, the title and the facts.
#[derive(Debug)]
struct Unit<'a> {
    turn: usize,
    role: SpeakerRole,
    /// The person who said it, where the segment's turns name their speakers ("Nate: ...");
    /// none in a chat between a user and an assistant.
    speaker: Option<&'a str>,
    /// The sentence as said.
    raw: &'a str,
    /// The sentence without a leading greeting or thanks clause.
    text: &'a str,
    spans: Vec<Span>,
    terms: Vec<Cow<'a, str>>,
    words: usize,
    cjk_chars: usize,
    question: bool,
    /// What a user statement signals to the summary (questions, chit-chat and commands state
    /// nothing): the importance rules' category.
    category: Option<Category>,
    /// A user statement of a personal fact ("my X is Y", "I live in").
    personal: bool,
    /// The kind of lasting statement its speaker makes about themselves, if it is a fact
    /// ([`statement_kind`]).
    fact_kind: Option<Category>,
    /// Worth summarising: not chit-chat, no control command, no short question, no assistant
    /// question, and it has a content term.
    eligible: bool,
    /// The first eligible user sentence of the segment.
    opening: bool,
}

impl Unit<'_> {
    /// A category signal or a personal fact: what an episode is remembered by.
    fn signal(&self) -> bool {
        self.personal
            || self
                .category
                .is_some_and(|category| category != Category::Fact)
    }
}

fn segment_units(turns: &[SegmentTurn]) -> Vec<Unit<'_>> {
    let mut units = Vec::new();
    let mut opening_seen = false;
    let named = names_speakers(turns);
    for (turn_index, turn) in turns.iter().enumerate() {
        // A system prompt is instructions to the assistant, not what the conversation said.
        if turn.role == SpeakerRole::System {
            continue;
        }
        let (speaker, content) = if named {
            match named_speaker(&turn.content) {
                Some((name, said)) => (Some(name), said),
                None => (None, turn.content.as_str()),
            }
        } else {
            (None, turn.content.as_str())
        };
        let by_user = turn.role == SpeakerRole::User;
        // In a dialog of named people, each states facts about themselves, whichever role the
        // client sent them as; in a chat, only the user does.
        let states_facts = by_user || speaker.is_some();
        for region in prose_regions(content) {
            for sentence in sentences(region) {
                let text = without_courtesy_prefix(sentence);
                let spans = spans(text);
                let terms = terms(text, &spans);
                let (words, cjk_chars) = size(&spans);
                let question = is_question(text, &spans);
                let chit_chat = text.is_empty() || is_chit_chat(text) || PLEASANTRY.is_match(text);
                // Only the user commands the memory; an assistant quoting "forget that" does not.
                // A named speaker's "remember that" is what they say, not a command: ingest runs
                // commands of the unnamed user alone.
                let command = if by_user && speaker.is_none() {
                    parse_command(text)
                } else {
                    None
                };
                let states = !question && !chit_chat && command.is_none();
                // Only the user in a chat speaks to the assistant (guidelines are theirs).
                let to_assistant = by_user && speaker.is_none();
                // A fact is a sentence; a "sentence" longer than a paragraph (a pasted text, a
                // blob no punctuation splits) states nothing to keep, and the statement rules
                // are not run over it (their cost grows with its length).
                let fact_kind = if states && states_facts && text.len() <= MAX_STATEMENT_BYTES {
                    statement_kind(text, to_assistant)
                } else {
                    None
                };
                // The summary weighs the user's statements by the importance rules' signals.
                let category = (states && by_user).then(|| summary_signal(text));
                let personal = states && by_user && states_personal_fact(text);
                let short_question =
                    question && words * 2 + cjk_chars < MIN_SUMMARY_QUESTION_WORDS * 2;
                let control_command = command
                    .as_ref()
                    .is_some_and(|command| !matches!(command, MemoryCommand::Remember(_)));
                // The assistant's questions ("Are you thinking of Kyoto?") add nothing the
                // episode needs; the user's say what the conversation was about.
                let assistant_question = question && !by_user;
                let eligible = !terms.is_empty()
                    && !chit_chat
                    && !control_command
                    && !short_question
                    && !assistant_question
                    && !is_phatic(text, words, cjk_chars);
                let opening = eligible && by_user && !opening_seen;
                opening_seen |= opening;
                units.push(Unit {
                    turn: turn_index,
                    role: turn.role,
                    speaker,
                    raw: sentence,
                    text,
                    spans,
                    terms,
                    words,
                    cjk_chars,
                    question,
                    category,
                    personal,
                    fact_kind,
                    eligible,
                    opening,
                });
            }
        }
    }
    units
}

/// A sentence said for the conversation's sake, not to tell anything: a reaction, compliment,
/// vague maybe or passing state ([`is_passing`]: "That's horrible.", "I'm so tired"), or an
/// exclamation of a word or two ("A banana!", "Amazing.", "Third!"). A summary has no room for
/// them. A short statement stays ("It's Parkinson's.", "Olympic distance.").
fn is_phatic(text: &str, words: usize, cjk_chars: usize) -> bool {
    // Said to someone by name first: "Rafa, that's beautiful."
    let addressed = VOCATIVE.find(text).map_or(text, |name| &text[name.end()..]);
    // What an interjection opens is a reaction too: "Oh no, poor thing", "Haha fair enough".
    let reacting = INTERJECTION_OPENING.is_match(text) || INTERJECTION_OPENING.is_match(addressed);
    if is_passing(text)
        || is_passing(addressed)
        || INTERJECTION.is_match(addressed)
        || REACTION.is_match(addressed)
        || reacting
    {
        return true;
    }
    let exclaimed = text.trim_end().ends_with(['!', '！']);
    cjk_chars == 0 && (words <= 1 || (words <= 2 && exclaimed))
}

/// A name and a comma opening a sentence: whom it is said to.
static VOCATIVE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\p{Lu}[\p{L}'’\-]*\s*[,，]\s*").expect("valid vocative regex"));

/// An interjection opening a sentence: what follows reacts to what the other said.
static INTERJECTION_OPENING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)^(?:oh+|ah+|aw+|ha(?:ha)+|lol|ugh|wow|ooh+|yikes|whoa|interesting|hmm+|哇|哎呀|天哪|哈哈+)(?:[\s,，!！.。]+|$)",
    )
    .expect("valid interjection regex")
});

/// Reactions, agreement and farewells by their opening: "That sounds like a plan", "That recipe
/// sounds amazing", "Good question", "Sounds great", "I'm glad it worked out", "Night, talk
/// tomorrow", "这句话说得真好", "晚安", "辛苦了". What the other said, judged by how it sounds or
/// looks ("this place looks amazing"), is a reaction; a thing said to be good ("This laptop is
/// great for coding") is not.
static REACTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)^(?:(?:that|this|it)(?:\s+[\p{L}'’\-]+)?\s+(?:sounds|looks|seems)\b|(?:这|那)(?:句话|话|个|样)?(?:说得|听起来|看起来)(?:真|太|很|好)?(?:好|棒|妙|有道理|不错|厉害)|sounds\s+(?:good|great|like|fun|lovely|amazing)|(?:good|great|fair)\s+(?:question|point|enough)|i'?m\s+(?:so\s+|really\s+)?glad\b|(?:good\s*)?night\b|bye\b|see\s+you\b|talk\s+(?:tomorrow|soon|later)\b|(?:have\s+)?fun\b|晚安|明天聊|回头聊|辛苦了|说得(?:真|太)?好|太厉害了|真厉害|好厉害)",
    )
    .expect("valid reaction regex")
});

/// A whole sentence that only reacts: "Thank god.", "Oh no!", "No way", "Me too", "天哪".
static INTERJECTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)^(?:thank\s+(?:god|goodness|heavens)|oh\s+(?:no|god|my\s+god|man|dear|wow)|no\s+way|me\s+too|same\s+here|omg|wow|yay|ugh|phew|oops|aww+|no|nooo+|yes+|so\s+cool|so\s+good|how\s+lovely|lucky\s+you|天哪|天啊|我的天|哇|好棒|太好了|真的吗)[\s!！.。?？~]*$",
    )
    .expect("valid interjection regex")
});

/// Labels that name a role, not a person: a transcript of "User: … / Assistant: …" is a chat.
const ROLE_LABELS: &[&str] = &[
    "user",
    "assistant",
    "ai",
    "bot",
    "system",
    "human",
    "me",
    "you",
];

/// The speaker a turn's label names, unless the label is a role.
fn named_speaker(content: &str) -> Option<(&str, &str)> {
    split_speaker(content).filter(|(label, _)| {
        !ROLE_LABELS
            .iter()
            .any(|role| label.eq_ignore_ascii_case(role))
    })
}

/// Whether the segment's turns name their speakers ("Nate: …", "Joanna: …"): most of them
/// carry a person's label and two people speak, or every one does (a segment may hold one
/// speaker's turns alone). Then each speaker's statements are facts about that speaker.
fn names_speakers(turns: &[SegmentTurn]) -> bool {
    let spoken: Vec<&SegmentTurn> = turns
        .iter()
        .filter(|turn| turn.role != SpeakerRole::System)
        .collect();
    let labels: Vec<String> = spoken
        .iter()
        .filter_map(|turn| named_speaker(&turn.content))
        .map(|(label, _)| label.to_lowercase())
        .collect();
    if labels.is_empty() {
        return false;
    }
    let people: HashSet<&String> = labels.iter().collect();
    labels.len() == spoken.len()
        || (people.len() >= 2 && labels.len() as f64 >= NAMED_TURNS_SHARE * spoken.len() as f64)
}

/// Chinese "我想去/我想在…住/我想学": a wish the importance rules leave out, because a bare "我想"
/// also means "I think".
static CHINESE_WISH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"我(?:很|也|还|就|一直|真的)?想(?:去|在|要|学|买|找|换|试|住|看|吃|做|把|用|考|搬|养|报|参加|尝试)")
        .expect("valid wish regex")
});

/// An instruction opening with "always" or "never" ("Always show me the idiomatic version"):
/// a standing rule for the assistant, phrased in more ways than the importance rules list.
static STANDING_INSTRUCTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^(?:please\s+)?(?:always|never|don'?t\s+ever)\s+(\p{L}+)")
        .expect("valid instruction regex")
});

/// Chinese "我明天把…提交上去", "我周末去…": a plan for a given day, which the importance rules
/// recognise only with a modal verb ("我会", "我要").
static CHINESE_DATED_PLAN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"我(?:们)?(?:今天|明天|后天|今晚|明早|明晚|下周[一二三四五六日天]?|下个?月|周末|这周|本周|待会儿?|等会儿?|晚点|回头)",
    )
    .expect("valid dated plan regex")
});

/// What the local rules add to the importance rules' kinds: Chinese wishes (goals), Chinese
/// dated plans (todos) and "always/never …" instructions (guidelines).
fn local_kind(text: &str) -> Option<Category> {
    if CHINESE_WISH.is_match(text) {
        Some(Category::Goal)
    } else if CHINESE_DATED_PLAN.is_match(text) {
        Some(Category::Todo)
    } else if STANDING_INSTRUCTION
        .captures(text)
        .is_some_and(|captures| !captures[1].eq_ignore_ascii_case("mind"))
    {
        Some(Category::Guideline)
    } else {
        None
    }
}

/// What a user's sentence signals to the summary: the importance rules' category, with what
/// [`local_kind`] adds where they see a plain fact.
fn summary_signal(text: &str) -> Category {
    match infer_category(text) {
        Category::Fact => local_kind(text).unwrap_or(Category::Fact),
        category => category,
    }
}

/// What lasting statement a sentence makes about its speaker ([`lasting_statement`]), else
/// what [`local_kind`] adds (a guideline only said to the assistant), else a personal fact
/// ("my X is Y", "I live in").
fn statement_kind(text: &str, to_assistant: bool) -> Option<Category> {
    if let Some(category) = lasting_statement(text, to_assistant) {
        return Some(category);
    }
    if is_passing(text) {
        return None;
    }
    local_kind(text)
        .filter(|kind| *kind != Category::Guideline || to_assistant)
        .or_else(|| states_personal_fact(text).then_some(Category::Fact))
}

/// What an assistant (or a user) says to close: "enjoy the trip!", "good luck", "祝旅途愉快".
/// Chit-chat to the summary, though the importance rules only know greetings and thanks.
static PLEASANTRY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)^(?:
            you'?re\s+(?:very\s+)?welcome|no\s+problem|my\s+pleasure
            |glad\s+(?:to|i\s+could)\s+help|happy\s+to\s+help
            |enjoy\b|have\s+(?:a|an)\s+(?:great|nice|good|wonderful|fun|safe)\b
            |good\s+luck|best\s+of\s+luck|take\s+care|see\s+you\b|bye\b
            |不客气|不用谢|没问题|祝|加油|再见|拜拜
        )",
    )
    .expect("valid pleasantry regex")
});

/// A leading "Hi,", "Thanks!", "OK, so", "你好，" clause: courtesy, not content. Only clauses set
/// off by punctuation go, so "no" in "No I don't" stays.
static COURTESY_PREFIX: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)^(?:
            (?:hi|hello|hey|hiya|ok|okay|oh|well|so|thanks|thank\s+you|thx|great|cool|nice|sure
               |yes|yeah|yep|alright|all\s+right|perfect|awesome|got\s+it
               |by\s+the\s+way|btw|anyway|actually|honestly|ha|haha|wow|oh\s+wow
               |good\s+(?:morning|afternoon|evening)
               |quick\s+(?:one|question|update|thing)|(?:big|good|bad|some)\s+news|news
               |update|fun\s+fact|heads\s+up|side\s+note)
            (?:\s+(?:there|again|so\s+much|a\s+lot|then))?
            \s*[,!.~:;—–-]+\s*
          # A greeting with the name of whom it greets (Hey Tomas,); thanks for something said
          # or done (Thanks for telling me, / Thank you so much for the recipe!).
          | (?:hi|hello|hey|hiya|dear)\s+\p{Lu}[\p{L}'’-]*\s*[,!.~:;—–-]+\s*
          | (?:thanks|thank\s+you)(?:\s+so\s+much)?\s+for(?:\s+[\p{L}'’-]+){1,4}\s*[,!.~:;—–-]+\s*
          | (?:你好|您好|嗨|哈喽|好的|好吧|好嘞|嗯+|哦+|谢谢你?|多谢|是的|对|没问题|明白了?|知道了|收到|懂了)
            [\s,，!！.。~～、]+
        )+",
    )
    .expect("valid courtesy regex")
});

/// A conjunction left at the start once the courtesy before it is gone ("Yes, and my manager
/// is Alice" → "my manager is Alice"), or that opens the sentence on its own.
static LEADING_CONJUNCTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^(?:and|also|plus|but|so)\b[\s,]*").expect("valid conjunction regex")
});

fn without_courtesy_prefix(sentence: &str) -> &str {
    let sentence = match COURTESY_PREFIX.find(sentence) {
        Some(prefix) => sentence[prefix.end()..].trim(),
        None => sentence,
    };
    match LEADING_CONJUNCTION.find(sentence) {
        // Not when nothing would be left ("And?").
        Some(conjunction)
            if sentence[conjunction.end()..]
                .chars()
                .any(char::is_alphanumeric) =>
        {
            sentence[conjunction.end()..].trim()
        }
        _ => sentence,
    }
}

/// Words that open an English question.
#[rustfmt::skip]
const QUESTION_OPENERS: &[&str] = &[
    "who", "what", "what's", "when", "where", "where's", "why", "how", "how's", "do", "does", "did",
    "can", "could", "would", "should", "is", "are", "which",
];

fn is_question(text: &str, spans: &[Span]) -> bool {
    let trimmed = text.trim_end_matches(|c: char| {
        c.is_whitespace() || matches!(c, ')' | '"' | '\'' | '”' | '’' | '」' | '』' | '）')
    });
    if trimmed.ends_with(['?', '？']) {
        return true;
    }
    // "你能推荐几家餐厅吗", "请问……": questions without a question mark.
    let unpunctuated = trimmed.trim_end_matches(|c: char| !c.is_alphanumeric());
    if unpunctuated.ends_with(['吗', '呢']) || text.starts_with("请问") {
        return true;
    }
    spans.first().is_some_and(|first| {
        !first.cjk && QUESTION_OPENERS.contains(&word_key(&text[first.start..first.end]).as_ref())
    })
}

/// Personal facts that carry no category signal of their own: identity, home, work, age,
/// family and pets.
static PERSONAL_FACT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)
        \bmy\s+(?:[\p{L}'-]+\s+){0,3}?(?:is|are|was|were)\b
      | \bmy\s+[\p{L}-]+'s\b
      | \bi\s+(?:live|lived|am\s+living|grew\s+up|was\s+born)\s+in\b
      | \bi'?m\s+(?:living|based|located)\s+in\b
      | \bi\s+(?:work|am\s+working)\s+(?:at|for|as|in|on)\b
      | \bi'?m\s+working\s+(?:at|for|as|in|on)\b
      | \bi\s+(?:study|am\s+studying)\s+(?:at|in)\b
      | \b(?:i'?m|i\s+am)\s+\d{1,3}(?:\s+years?\s+old|\s*y/?o)?\b
      | \b(?:i'?m|i\s+am)\s+(?:a|an)\s+(?P<what>[\p{L}-]+)
      | \b(?:i'?m|i\s+am)\s+from\b
      | \bi\s+speak\b
      | \bi\s+(?:have|own|got)\s+(?:a|an|one|two|three|four|\d+)\s+(?:[\p{L}-]+\s+)?
          (?:dogs?|cats?|kids?|children|sons?|daughters?|brothers?|sisters?|wife|husband|partner
            |boyfriend|girlfriend|car|bike|house|apartment|flat)\b
      | \bi'?m\s+(?:married|single|divorced|engaged|retired|pregnant)\b
      | 我的.{1,12}?是
      | 我(?:现在|目前)?(?:住在|住于|定居在?)
      | 我(?:现在|目前)?在.{1,15}?(?:工作|上班|上学|读书|实习)
      | 我(?:今年)?\d{1,3}岁|我今年[一二三四五六七八九十]{1,3}岁
      | 我是(?:一名|一个|一位)
      | 我叫|我来自|我老家|我家在|我会说
      | 我有(?:一|两|二|三|四|\d+)(?:个|只|条|辆|套)
      | 我(?:已经)?(?:结婚|退休)了
        ",
    )
    .expect("valid personal fact regex")
});

/// "I'm a bit tired" is no statement of what the user is.
const NOT_AN_IDENTITY: &[&str] = &["bit", "little", "tad", "lot", "huge", "big"];

fn states_personal_fact(text: &str) -> bool {
    // Most sentences match no rule: the cheap test first.
    if !PERSONAL_FACT.is_match(text) {
        return false;
    }
    PERSONAL_FACT.captures_iter(text).any(|captures| {
        captures
            .name("what")
            .is_none_or(|what| !NOT_AN_IDENTITY.contains(&what.as_str().to_lowercase().as_str()))
    })
}

// ---------------------------------------------------------------------------------------------
// Salience and scores

/// Term weights of a segment: frequency (a user's use counts [`USER_WEIGHT`]) times
/// `ln(1 + sentences / sentences containing the term)`, which weighs down what every sentence
/// says.
struct Salience<'a> {
    /// Per term: its weight, and how many eligible sentences contain it.
    terms: HashMap<&'a str, (f64, usize)>,
}

impl<'a> Salience<'a> {
    fn of(units: &'a [Unit<'_>]) -> Self {
        let mut terms: HashMap<&'a str, (f64, usize)> = HashMap::new();
        let mut sentence_count = 0usize;
        for unit in units.iter().filter(|unit| unit.eligible) {
            sentence_count += 1;
            let weight = role_weight(unit.role);
            for term in &unit.terms {
                let entry = terms.entry(term.as_ref()).or_insert((0.0, 0));
                entry.0 += weight;
                entry.1 += 1;
            }
        }
        let total = sentence_count as f64;
        for (frequency, sentences) in terms.values_mut() {
            *frequency *= (1.0 + total / *sentences as f64).ln();
        }
        Salience { terms }
    }

    fn weight(&self, term: &str) -> f64 {
        self.terms.get(term).map_or(0.0, |(weight, _)| *weight)
    }

    /// In how many eligible sentences a term occurs.
    fn sentence_count(&self, term: &str) -> usize {
        self.terms.get(term).map_or(0, |(_, count)| *count)
    }
}

fn role_weight(role: SpeakerRole) -> f64 {
    match role {
        SpeakerRole::User => USER_WEIGHT,
        SpeakerRole::Assistant | SpeakerRole::System => 1.0,
    }
}

/// A sentence's summary score: the salience of its terms, normalised by the square root of
/// their number (neither the longest nor the shortest sentence wins by length alone), then
/// weighed by who said it and what it is. Ineligible sentences score 0.
fn unit_score(unit: &Unit<'_>, salience: &Salience<'_>) -> f64 {
    if !unit.eligible {
        return 0.0;
    }
    let total: f64 = unit.terms.iter().map(|term| salience.weight(term)).sum();
    let mut score = total / (unit.terms.len() as f64).sqrt();
    score *= role_weight(unit.role);
    if unit.signal() {
        score *= SIGNAL_WEIGHT;
    }
    if unit.question {
        score *= QUESTION_WEIGHT;
    }
    if unit.opening {
        score *= OPENING_WEIGHT;
    }
    score
}

// ---------------------------------------------------------------------------------------------
// Summary

fn summary(units: &[Unit<'_>], scores: &[f64]) -> String {
    let best = scores.iter().copied().fold(0.0, f64::max);
    let mut ranked: Vec<usize> = (0..units.len())
        .filter(|&index| scores[index] > 0.0 && scores[index] >= best * SUMMARY_SCORE_FLOOR)
        .collect();
    // Best first; the earlier sentence on a tie, so that the same input gives the same summary.
    ranked.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));

    let mut chosen: Vec<(usize, String)> = Vec::new();
    let mut seen = HashSet::new();
    let mut length = 0;
    for index in ranked {
        // One name per turn, paid for by the first of its sentences chosen; the name moves to
        // the turn's earliest chosen sentence below, at the same length.
        let named = !chosen
            .iter()
            .any(|&(other, _)| units[other].turn == units[index].turn);
        let sentence = summary_sentence(&units[index], named);
        let added = sentence.chars().count() + usize::from(!chosen.is_empty());
        if length + added > MAX_SUMMARY_CHARS || !seen.insert(normalize_for_fingerprint(&sentence))
        {
            continue;
        }
        length += added;
        chosen.push((index, sentence));
        // No sentence is shorter than a word and its full stop.
        if MAX_SUMMARY_CHARS - length < 4 {
            break;
        }
    }

    if chosen.is_empty() {
        // Every salient sentence is longer than the limit, or nothing is salient (chit-chat):
        // the best sentence cut, else what the user said, so the episode still says something.
        let fallback = match ranked_first(scores) {
            Some(index) => summary_sentence(&units[index], true),
            None => units
                .iter()
                .filter(|unit| unit.role == SpeakerRole::User)
                .map(|unit| unit.raw)
                .collect::<Vec<_>>()
                .join(" "),
        };
        return truncate_at_word(&fallback, MAX_SUMMARY_CHARS);
    }

    chosen.sort_by_key(|(index, _)| *index);
    // A named speaker's name opens the first sentence of theirs the summary shows from a turn,
    // whichever sentence of the turn that is: when the turn's opening greeting is left out, the
    // sentence after it still says who spoke ("Joanna: Pretty good, I finished my draft.").
    let mut previous_turn = None;
    for (index, sentence) in &mut chosen {
        let turn = units[*index].turn;
        *sentence = summary_sentence(&units[*index], previous_turn != Some(turn));
        previous_turn = Some(turn);
    }
    join_sentences(chosen.iter().map(|(_, sentence)| sentence.as_str()))
}

fn ranked_first(scores: &[f64]) -> Option<usize> {
    (0..scores.len())
        .filter(|&index| scores[index] > 0.0)
        .max_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(b.cmp(&a)))
}

/// Sentences joined by a space, except after a CJK full stop, where Chinese puts none.
fn join_sentences<'a>(sentences: impl Iterator<Item = &'a str>) -> String {
    let mut joined = String::new();
    for sentence in sentences {
        if !joined.is_empty() && !joined.ends_with(['。', '！', '？']) {
            joined.push(' ');
        }
        joined.push_str(sentence);
    }
    joined
}

/// A sentence as the summary shows it: inline Markdown markers gone, ending in punctuation so
/// that joined sentences stay readable (a question without its mark gets one).
/// `named`: the first sentence shown of its turn, which a named speaker's name opens.
fn summary_sentence(unit: &Unit<'_>, named: bool) -> String {
    let sentence = summary_words(unit);
    match unit.speaker {
        Some(name) if named => format!("{name}: {sentence}"),
        _ => sentence,
    }
}

/// The sentence's words as the summary shows them (see [`summary_sentence`]).
fn summary_words(unit: &Unit<'_>) -> String {
    let cleaned = unit
        .text
        .replace("**", "")
        .replace("__", "")
        .replace('`', "");
    let cleaned = cleaned.trim();
    let ends_punctuated = cleaned.ends_with(|c: char| {
        is_terminator(c) || matches!(c, ')' | '"' | '\'' | '”' | '’' | '」' | '』' | '）')
    });
    if ends_punctuated || cleaned.is_empty() {
        return cleaned.to_owned();
    }
    let mut sentence = with_full_stop(cleaned);
    if unit.question {
        let question_mark = if sentence.ends_with('。') {
            '？'
        } else {
            '?'
        };
        sentence.pop();
        sentence.push(question_mark);
    }
    sentence
}

/// The text ending in one full stop: "。" when it ended in a CJK terminator, or in none and is
/// mostly CJK; "." otherwise. Terminators and trailing separators are replaced, so
/// "I love ramen!!" becomes "I love ramen." and "我们决定买JR Pass。" keeps its "。".
fn with_full_stop(text: &str) -> String {
    let trimmed = text.trim();
    let body = trimmed.trim_end_matches(|c: char| {
        c.is_whitespace() || is_terminator(c) || matches!(c, ',' | '，' | ';' | ':' | '：' | '、')
    });
    if body.is_empty() {
        return trimmed.to_owned();
    }
    // 'I said "I love it."': the quote closes a sentence that already ended.
    let before_closers = trimmed.trim_end_matches(is_closing_mark);
    if before_closers.len() < trimmed.len() && before_closers.ends_with(is_terminator) {
        return trimmed.to_owned();
    }
    let ending = &trimmed[body.len()..];
    let full_width = if ending.contains(['。', '！', '？', '；', '，', '：', '、']) {
        true
    } else if ending.contains(['.', '!', '?', ';', ',', ':', '…']) {
        false
    } else {
        let (words, cjk_chars) = size(&spans(body));
        cjk_chars > words
    };
    let stop = if full_width { '。' } else { '.' };
    format!("{body}{stop}")
}

/// At most `max_chars` characters: the text whole, or cut at a word boundary (any character
/// boundary in CJK text) and ended with "…".
pub fn truncate_at_word(text: &str, max_chars: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let budget = max_chars.saturating_sub(1);
    let cut = text
        .char_indices()
        .nth(budget)
        .map_or(text.len(), |(index, _)| index);
    let head = &text[..cut];
    let next = text[cut..].chars().next();
    let at_boundary = next.is_none_or(|c| c.is_whitespace() || is_cjk(c))
        || head.chars().last().is_some_and(is_cjk);
    let head = if at_boundary {
        head
    } else {
        // Back to the last space, unless that throws away more than half the room (one very
        // long token): then the token is cut.
        match head.rfind(char::is_whitespace) {
            Some(space) if head[..space].chars().count() >= budget / 2 => &head[..space],
            _ => head,
        }
    };
    let head = head.trim_end_matches(|c: char| {
        c.is_whitespace() || matches!(c, ',' | ';' | ':' | '-' | '，' | '、' | '；' | '：')
    });
    format!("{head}…")
}

// ---------------------------------------------------------------------------------------------
// Title

fn title(
    units: &[Unit<'_>],
    scores: &[f64],
    salience: &Salience<'_>,
    entity_tags: &HashSet<String>,
) -> String {
    let user_text_is_cjk = mostly_cjk(units);
    let from_phrases = if user_text_is_cjk {
        None
    } else {
        keyphrase_title(units, scores, salience, entity_tags)
    };
    let title = from_phrases
        .or_else(|| opening_sentence_title(units, user_text_is_cjk))
        .unwrap_or_else(|| UNTITLED.to_owned());
    truncate_at_word(&capitalise_first(&title), MAX_TITLE_CHARS)
}

/// Whether the user wrote mostly CJK: more CJK characters than other words.
fn mostly_cjk(units: &[Unit<'_>]) -> bool {
    let (words, cjk_chars) = units
        .iter()
        .filter(|unit| unit.role == SpeakerRole::User)
        .map(|unit| size(&unit.spans))
        .fold((0, 0), |(words, cjk), (w, c)| (words + w, cjk + c));
    cjk_chars > 0 && cjk_chars >= words
}

/// A candidate keyphrase: a run of up to [`MAX_PHRASE_WORDS`] content words.
struct Phrase {
    words: Vec<String>,
    /// How often it occurs, a user's use counting [`USER_WEIGHT`].
    occurrences: f64,
    surface: String,
    /// The surface comes from the start of a sentence, where capitals say nothing.
    surface_at_sentence_start: bool,
    first_seen: usize,
}

/// Every content word of the scored sentences, and every stretch of two or three ("JR Pass"
/// recurs within "the JR Pass" and "a 7-day JR Pass"), by its lowercased words: how often it
/// was said (weighted by who said it) and how it was written.
fn candidate_phrases(units: &[Unit<'_>], scores: &[f64]) -> HashMap<String, Phrase> {
    let mut phrases: HashMap<String, Phrase> = HashMap::new();
    let mut order = 0;
    let mut key = String::new();
    for (index, unit) in units.iter().enumerate() {
        if scores[index] <= 0.0 {
            continue;
        }
        // Lowercased words, computed once per sentence; CJK characters have none.
        let keys: Vec<Option<Cow<'_, str>>> = unit
            .spans
            .iter()
            .map(|span| (!span.cjk).then(|| word_key(&unit.text[span.start..span.end])))
            .collect();
        for run in content_runs(unit.text, &unit.spans, &keys) {
            for width in 1..=MAX_PHRASE_WORDS.min(run.len()) {
                for first_position in run.start..=run.end - width {
                    let last_position = first_position + width - 1;
                    let words = keys[first_position..=last_position].iter().flatten();
                    key.clear();
                    for (position, word) in words.clone().enumerate() {
                        if position > 0 {
                            key.push(' ');
                        }
                        key.push_str(word);
                    }
                    let (first, last) = (unit.spans[first_position], unit.spans[last_position]);
                    let surface = &unit.text[first.start..last.end];
                    let at_sentence_start = first_position == 0;
                    order += 1;
                    let phrase = match phrases.get_mut(key.as_str()) {
                        Some(phrase) => phrase,
                        None => phrases.entry(key.clone()).or_insert(Phrase {
                            words: words.map(|word| word.to_string()).collect(),
                            occurrences: 0.0,
                            surface: surface.to_owned(),
                            surface_at_sentence_start: at_sentence_start,
                            first_seen: order,
                        }),
                    };
                    phrase.occurrences += role_weight(unit.role);
                    if phrase.surface_at_sentence_start && !at_sentence_start {
                        phrase.surface = surface.to_owned();
                        phrase.surface_at_sentence_start = false;
                    }
                }
            }
        }
    }

    phrases
}

/// The keyphrases a title names, best first: ranked by the salience of their words and their
/// recurrence, none naming a speaker, none overlapping a better one, within the title's length.
fn title_phrases<'p>(
    phrases: &'p HashMap<String, Phrase>,
    units: &[Unit<'_>],
    salience: &Salience<'_>,
    entity_tags: &HashSet<String>,
) -> Vec<&'p Phrase> {
    // The people talking are no topic: "Caroline, Melanie" names no conversation.
    let speakers: HashSet<String> = units
        .iter()
        .filter_map(|unit| unit.speaker)
        .flat_map(|name| name.split_whitespace().map(str::to_lowercase))
        .collect();
    let mut ranked: Vec<(f64, &String, &Phrase)> = phrases
        .iter()
        .filter(|(_, phrase)| !phrase.words.iter().any(|word| speakers.contains(word)))
        .map(|(key, phrase)| {
            let word_salience: f64 = phrase.words.iter().map(|word| salience.weight(word)).sum();
            // Word salience already counts frequency; a phrase said again and again is a
            // name for the topic, so its own recurrence counts too.
            let mut score = word_salience * (1.0 + phrase.occurrences.ln().max(0.0));
            if entity_tags.contains(key) {
                score *= ENTITY_WEIGHT;
            }
            (score, key, phrase)
        })
        .filter(|(score, _, phrase)| {
            *score > 0.0
                && (phrase.words.len() == 1 || phrase.occurrences >= MIN_PHRASE_OCCURRENCES)
        })
        .collect();
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.2.first_seen.cmp(&b.2.first_seen))
    });
    let Some(&(best, _, _)) = ranked.first() else {
        return Vec::new();
    };

    let mut chosen: Vec<&Phrase> = Vec::new();
    let mut length = 0;
    for (score, _, phrase) in ranked {
        if chosen.len() == MAX_TITLE_PHRASES || score < best * TITLE_SCORE_FLOOR {
            break;
        }
        // "kyoto" after "kyoto ryokan" adds nothing.
        let overlaps = chosen
            .iter()
            .any(|kept| kept.words.iter().any(|word| phrase.words.contains(word)));
        if overlaps {
            continue;
        }
        let added = phrase.surface.chars().count() + if chosen.is_empty() { 0 } else { 2 };
        if length + added > MAX_TITLE_CHARS {
            break;
        }
        length += added;
        chosen.push(phrase);
    }
    chosen
}

/// The most salient keyphrases joined by commas ("Kyoto, Tokyo, traditional ryokan"), or `None`
/// when the segment has none.
fn keyphrase_title(
    units: &[Unit<'_>],
    scores: &[f64],
    salience: &Salience<'_>,
    entity_tags: &HashSet<String>,
) -> Option<String> {
    let phrases = candidate_phrases(units, scores);
    let chosen = title_phrases(&phrases, units, salience, entity_tags);
    if chosen.is_empty() {
        return None;
    }
    // A short phrase naming the topic: the clause that says the best keyphrase. A list of the
    // keyphrases only where no clause reads as one.
    // Of the headlines the keyphrases give, the one that names most of them.
    let names_of = |headline: &str| {
        let said: HashSet<String> = word_keys(headline).into_iter().collect();
        chosen
            .iter()
            .filter(|phrase| phrase.words.iter().all(|word| said.contains(word)))
            .count()
    };
    let best_headline = chosen
        .iter()
        .filter_map(|phrase| headline(units, scores, &phrase.words))
        .enumerate()
        .max_by_key(|(order, headline)| (names_of(headline), std::cmp::Reverse(*order)))
        .map(|(_, headline)| headline);
    if best_headline.is_some() {
        return best_headline;
    }
    let parts: Vec<String> = chosen
        .iter()
        .map(|phrase| {
            if phrase.surface_at_sentence_start {
                phrase.words.join(" ")
            } else {
                phrase.surface.replace(char::is_whitespace, " ")
            }
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Where a sentence's clauses part, for a headline.
static HEADLINE_CLAUSE_BREAK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\s*[,;:!?()—–]\s*|\s+-\s+|\.\s+|\s+(?:but|and|so|because|which|who|although|though|while|whereas|if)\s+",
    )
    .expect("valid headline clause regex")
});

/// A sentence's clauses, parted at [`HEADLINE_CLAUSE_BREAK`] but not at a comma within a number
/// ("18,000 euros" is one clause's words, not "18" and "000 euros"; the regex crate has no
/// look-around to say so in the pattern).
fn headline_clauses(text: &str) -> impl Iterator<Item = &str> {
    let digit_at = |at: usize| {
        text[at..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    };
    let digit_before = |at: usize| {
        text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_digit())
    };
    let mut breaks = HEADLINE_CLAUSE_BREAK
        .find_iter(text)
        .filter(move |found| {
            !(found.as_str() == "," && digit_before(found.start()) && digit_at(found.end()))
        })
        .map(|found| (found.start(), found.end()));
    let mut from = Some(0);
    std::iter::from_fn(move || {
        let start = from?;
        match breaks.next() {
            Some((end, next)) => {
                from = Some(next);
                Some(&text[start..end])
            }
            None => {
                from = None;
                Some(&text[start..])
            }
        }
    })
}

/// What opens a clause without naming its topic: fillers, and its speaker as the subject ("so
/// we've just", "Big news: I", "honestly I'm").
static HEADLINE_OPENER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?ix)^
        (?:(?:so|well|oh|and|but|also|actually|anyway|honestly|yeah|yes|ok|okay|btw|finally|now|guess\s+what|big\s+news|by\s+the\s+way)\b[\s,!:]*)*
        (?:(?:i|we)(?:'m|’m|'re|’re|'ve|’ve|'d|’d|'ll|’ll|\s+am|\s+are|\s+have|\s+had|\s+will)?\s+
           (?:just\s+|finally\s+|really\s+|also\s+|actually\s+|recently\s+|already\s+|still\s+|totally\s+)*)?",
    )
    .expect("valid headline opener regex")
});

/// A headline of at most this many words.
const MAX_HEADLINE_WORDS: usize = 9;
/// Words a headline keeps either side of its keyphrase when the clause is longer.
const HEADLINE_CONTEXT_WORDS: usize = 3;

/// The clause of the first statement that says the keyphrase `topic` (its words as keys),
/// without its opening fillers and first-person subject, cut to a few words around the
/// keyphrase: "we moved to Lisbon last month, boxes everywhere" gives "Moved to Lisbon last
/// month". `None` when no statement says it, or what is left says too little to stand alone.
fn headline(units: &[Unit<'_>], scores: &[f64], topic: &[String]) -> Option<String> {
    // The statements that say it, in order, a user's first where a user says it: the first
    // is where the topic is brought up.
    let says_it = |(index, unit): &(usize, &Unit<'_>)| {
        scores[*index] > 0.0
            && !unit.question
            && keyphrase_at(&word_keys(unit.text), topic).is_some()
    };
    let statements = units.iter().enumerate().filter(says_it);
    let (users, others): (Vec<_>, Vec<_>) =
        statements.partition(|(_, unit)| unit.role == SpeakerRole::User);
    users.into_iter().chain(others).find_map(|(_, unit)| {
        headline_clauses(unit.text)
            .find(|clause| keyphrase_at(&word_keys(clause), topic).is_some())
            .and_then(|clause| headline_of_clause(clause, topic))
    })
}

/// A text's words as keys ([`word_key`]), split at anything but letters, digits, apostrophes
/// and hyphens.
fn word_keys(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’' || c == '-'))
        .filter(|word| !word.is_empty())
        .map(|word| word_key(word).into_owned())
        .collect()
}

/// Where the keyphrase `topic` starts among `keys`.
fn keyphrase_at(keys: &[String], topic: &[String]) -> Option<usize> {
    if topic.is_empty() {
        return None;
    }
    keys.windows(topic.len())
        .position(|window| window.iter().zip(topic).all(|(key, word)| key == word))
}

/// A clause saying the keyphrase, as a headline: see [`headline`].
fn headline_of_clause(clause: &str, topic: &[String]) -> Option<String> {
    let clause = clause.trim().trim_end_matches(['.', '!', '?', '…']);
    let clause = &clause[HEADLINE_OPENER
        .find(clause)
        .map_or(0, |opener| opener.end())..];
    let words: Vec<&str> = clause.split_whitespace().collect();
    let keys: Vec<String> = words.iter().map(|word| word_keys(word).join(" ")).collect();
    let at = keyphrase_at(&keys, topic)?;
    let (mut start, mut end) = (0, words.len());
    if words.len() > MAX_HEADLINE_WORDS {
        // The clause's opening words where they hold the keyphrase, else a few either side.
        if at + topic.len() <= MAX_HEADLINE_WORDS {
            end = MAX_HEADLINE_WORDS;
        } else {
            start = at.saturating_sub(HEADLINE_CONTEXT_WORDS);
            end = (at + topic.len() + HEADLINE_CONTEXT_WORDS).min(words.len());
        }
        // A cut headline starts and ends on a word that says something.
        while start < at && !is_content_word(&keys[start]) {
            start += 1;
        }
        while end > at + topic.len() && !is_content_word(&keys[end - 1]) {
            end -= 1;
        }
    }
    // A headline says something of its own: three words or more, two of them content words,
    // not a clause that leans on the one before ("Then Mum called", "Which feels rude").
    let content_words = keys[start..end]
        .iter()
        .filter(|key| is_content_word(key))
        .count();
    let leans_back = HEADLINE_LEANS_BACK.contains(&keys[start].as_str());
    if end - start < 3 || content_words < 2 || leans_back {
        return None;
    }
    let headline = words[start..end].join(" ");
    let headline = headline.trim_end_matches([',', ';', ':', '-']);
    Some(capitalise_first(headline))
}

/// First words of a clause that only reads after the one before it.
const HEADLINE_LEANS_BACK: &[&str] = &[
    "which", "then", "it", "it's", "that", "that's", "this", "she", "she's", "he", "he's", "they",
    "they're", "you", "you're", "you'll", "there", "there's", "so", "but", "and", "or", "because",
    "since", "also", "even", "though",
];

/// Runs of adjacent content words (as span positions), separated by nothing but spaces and
/// hyphens: stop words, numbers, punctuation and CJK characters break a run.
fn content_runs(
    text: &str,
    spans: &[Span],
    keys: &[Option<Cow<'_, str>>],
) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut run_start: Option<usize> = None;
    for (position, span) in spans.iter().enumerate() {
        let is_content = keys[position].as_deref().is_some_and(is_content_word);
        let joined_to_previous = position > 0
            && text[spans[position - 1].end..span.start]
                .chars()
                .all(|c| c == ' ' || c == '-');
        match (is_content, run_start) {
            (true, Some(_)) if joined_to_previous => {}
            (true, Some(start)) => {
                runs.push(start..position);
                run_start = Some(position);
            }
            (true, None) => run_start = Some(position),
            (false, Some(start)) => {
                runs.push(start..position);
                run_start = None;
            }
            (false, None) => {}
        }
    }
    if let Some(start) = run_start {
        runs.push(start..spans.len());
    }
    runs
}

/// The first substantive user sentence as a title: for CJK its opening clause (or its first
/// [`MAX_CJK_TITLE_CHARS`] characters); otherwise the sentence, to be cut at a word boundary.
/// Without a substantive sentence, the first sentence with a letter or digit.
fn opening_sentence_title(units: &[Unit<'_>], cjk: bool) -> Option<String> {
    let sentence = units
        .iter()
        .find(|unit| unit.opening)
        .map(|unit| unit.text)
        .or_else(|| {
            units
                .iter()
                .find(|unit| unit.role == SpeakerRole::User)
                .or_else(|| units.first())
                .map(|unit| unit.raw)
        })?;
    let sentence = sentence
        .replace("**", "")
        .replace('`', "")
        .trim_end_matches(|c: char| is_terminator(c) || c.is_whitespace())
        .to_owned();
    if !cjk {
        return Some(sentence);
    }
    let clause_end = sentence
        .char_indices()
        .find(|&(_, c)| matches!(c, '，' | ',' | '、' | '：' | ':' | '；'))
        .map(|(index, _)| index);
    let clause = match clause_end {
        Some(end) if sentence[..end].chars().count() >= 4 => &sentence[..end],
        _ => sentence.as_str(),
    };
    Some(truncate_at_word(clause, MAX_CJK_TITLE_CHARS))
}

fn capitalise_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) if first.is_lowercase() => first.to_uppercase().chain(chars).collect(),
        _ => text.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Entities

/// Metadata tags over the segment's turns.
struct SegmentTags {
    /// The most widely mentioned tags, at most [`MAX_ENTITIES`].
    entities: Vec<String>,
    /// Every tag found in a user turn.
    user_tags: HashSet<String>,
}

/// A recurring CJK phrase named in a turn counts this much of a metadata tag: metadata finds few
/// entities in Chinese (no capitals, no spaces to find them by), and the phrases that recur are
/// the segment's names, places and things.
const CJK_TERM_ENTITY_WEIGHT: f64 = 0.8;
/// A recurring CJK phrase longer than this is more likely a repeated clause than a name.
const MAX_CJK_ENTITY_CHARS: usize = 6;

/// The CJK phrases of a sentence made of bigrams that recur in the segment: "日式旅馆" from 日式,
/// 式旅 and 旅馆 all recurring, so that a word of four characters is one entity rather than
/// three overlapping halves.
fn recurring_cjk_phrases<'a>(unit: &Unit<'a>, salience: &Salience<'_>) -> Vec<&'a str> {
    let recurs = |first: &Span, second: &Span| {
        second.cjk
            && second.start == first.end
            && salience.sentence_count(&unit.text[first.start..second.end]) >= 2
    };
    let mut phrases = Vec::new();
    let mut position = 0;
    while position + 1 < unit.spans.len() {
        let first = unit.spans[position];
        if !first.cjk || !recurs(&first, &unit.spans[position + 1]) {
            position += 1;
            continue;
        }
        let mut last = position + 1;
        while last + 1 < unit.spans.len() && recurs(&unit.spans[last], &unit.spans[last + 1]) {
            last += 1;
        }
        let phrase = &unit.text[first.start..unit.spans[last].end];
        if phrase.chars().count() <= MAX_CJK_ENTITY_CHARS {
            phrases.push(phrase);
        }
        position = last + 1;
    }
    phrases
}

impl SegmentTags {
    /// Tags are extracted per turn (from its eligible sentences) and ranked by how many turns
    /// mention them, a user turn counting [`USER_WEIGHT`] and a tag counting less the further down
    /// its turn's list (metadata lists the most confident first), then weighed by the salience of
    /// their words. Recurring CJK phrases join them.
    fn of(units: &[Unit<'_>], salience: &Salience<'_>) -> Self {
        let mut scores: HashMap<String, (f64, usize)> = HashMap::new();
        let mut user_tags = HashSet::new();
        let mut order = 0;
        let most_salient = salience
            .terms
            .values()
            .map(|(weight, _)| *weight)
            .fold(0.0, f64::max);
        // Each turn's eligible sentences: chit-chat, commands and code name no entities.
        for turn in units.chunk_by(|a, b| a.turn == b.turn) {
            let role = turn[0].role;
            let prose = turn
                .iter()
                .filter(|unit| unit.eligible && !metadata_finds_nothing_in(unit.text))
                .map(|unit| unit.text)
                .collect::<Vec<_>>()
                .join("\n");
            if prose.is_empty() {
                continue;
            }
            let tags = metadata::extract(&prose).tags;
            for (rank, tag) in tags
                .into_iter()
                .filter(|tag| is_useful_tag(tag))
                .enumerate()
            {
                order += 1;
                let weight = role_weight(role) / (1.0 + 0.15 * rank as f64);
                if role == SpeakerRole::User {
                    user_tags.insert(tag.clone());
                }
                scores.entry(tag).or_insert((0.0, order)).0 += weight;
            }
        }
        // What the segment keeps coming back to outranks what one turn happened to mention.
        if most_salient > 0.0 {
            for (tag, (score, _)) in scores.iter_mut() {
                let tag_spans = spans(tag);
                let tag_salience: f64 = terms(tag, &tag_spans)
                    .iter()
                    .map(|term| salience.weight(term))
                    .sum();
                *score *= 0.5 + (tag_salience / most_salient).min(1.0);
            }
        }

        // Per turn, each recurring CJK phrase once.
        let mut named_in: HashSet<(usize, &str)> = HashSet::new();
        for unit in units.iter().filter(|unit| unit.eligible) {
            for phrase in recurring_cjk_phrases(unit, salience) {
                if named_in.insert((unit.turn, phrase)) {
                    order += 1;
                    let weight = role_weight(unit.role) * CJK_TERM_ENTITY_WEIGHT;
                    scores.entry(phrase.to_owned()).or_insert((0.0, order)).0 += weight;
                }
            }
        }

        let mut ranked: Vec<(String, (f64, usize))> = scores.into_iter().collect();
        ranked.sort_by(|a, b| b.1.0.total_cmp(&a.1.0).then(a.1.1.cmp(&b.1.1)));
        SegmentTags {
            entities: ranked
                .into_iter()
                .take(MAX_ENTITIES)
                .map(|(tag, _)| tag)
                .collect(),
            user_tags,
        }
    }
}

/// Whether [`metadata::extract`] can find nothing in a sentence because it is plain Chinese: CJK
/// characters and CJK punctuation only, without the digits, Latin letters, quotes, title marks,
/// `#`, `@`, currency signs or weekday characters (星期, 周) its detectors look for. Metadata's
/// Unicode-aware rules are slowest on exactly such text, and a Chinese segment is mostly made of
/// it; `plain_chinese_yields_no_metadata` fails should metadata learn to read it.
fn metadata_finds_nothing_in(text: &str) -> bool {
    text.chars().all(|c| {
        (is_cjk(c) && c != '星' && c != '周')
            || c.is_whitespace()
            || matches!(
                c,
                '，' | '。' | '！' | '？' | '、' | '；' | '：' | '…' | '（' | '）' | '—' | '～'
            )
    })
}

/// Whether a metadata tag names something: not a lone stop word ("thanks", "next"), and not a
/// capitalised span run into Chinese text ("pass可以覆盖", where no space ended it).
fn is_useful_tag(tag: &str) -> bool {
    if !tag.contains(' ') && STOP_WORD_SET.contains(tag) {
        return false;
    }
    let mut previous: Option<char> = None;
    for c in tag.chars() {
        if let Some(before) = previous {
            let latin_then_cjk = before.is_ascii_alphanumeric() && is_cjk(c);
            let cjk_then_latin = is_cjk(before) && c.is_ascii_alphanumeric();
            if latin_then_cjk || cjk_then_latin {
                return false;
            }
        }
        previous = Some(c);
    }
    true
}

// ---------------------------------------------------------------------------------------------
// Facts

fn facts_of(units: &[Unit<'_>]) -> Vec<ExtractedFact> {
    let mut seen = HashSet::new();
    let mut facts = Vec::new();
    for unit in units {
        let too_short = if unit.cjk_chars > 0 {
            unit.words + unit.cjk_chars < 4
        } else {
            unit.words < 3
        };
        // Statements only: no questions, chit-chat or commands; a chat's assistant states none.
        let Some(category) = unit.fact_kind else {
            continue;
        };
        if too_short || unit.terms.is_empty() {
            continue;
        }
        // Two statements joined in one sentence, each standing alone, are two facts.
        let to_assistant = unit.role == SpeakerRole::User && unit.speaker.is_none();
        let statements = match two_statements(unit.text, to_assistant) {
            Some([first, second]) => vec![first, second],
            None => vec![(unit.text, category)],
        };
        for (statement, category) in statements {
            // Whom it is about: a named speaker's fact says so; a chat's are the user's.
            let text = match unit.speaker {
                Some(name) => format!("{name}: {}", with_full_stop(statement)),
                None => with_full_stop(statement),
            };
            if !seen.insert(normalize_for_fingerprint(&text)) {
                continue;
            }
            let mut keywords: Vec<String> = if metadata_finds_nothing_in(&text) {
                Vec::new()
            } else {
                metadata::extract(&text)
                    .tags
                    .into_iter()
                    .filter(|tag| is_useful_tag(tag))
                    .collect()
            };
            keywords.truncate(MAX_FACT_KEYWORDS);
            facts.push(ExtractedFact {
                text,
                category,
                keywords,
                turn: unit.turn,
            });
        }
    }
    facts
}

/// Where a sentence joins two statements of its speaker: "…, and I …", "…, but my …", "…; we …".
static STATEMENT_JOIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?:,\s+(?:and|but|so|plus|also)\s+|;\s+)(?:also\s+)?(?:i|i'm|i've|i'd|my|we|we're|we've|our)\b",
    )
    .expect("valid statement join regex")
});

/// A sentence of two statements that each stand alone as a fact ("I moved to Lisbon last year,
/// and I work at a bakery now"), split in two with each one's kind; `None` when it is one
/// statement, or when a half says nothing on its own ("I love it, and I'd go again").
fn two_statements(text: &str, to_assistant: bool) -> Option<[(&str, Category); 2]> {
    let join = STATEMENT_JOIN.find(text)?;
    let first = text[..join.start()].trim();
    // The second keeps its subject ("I work at …"), not the conjunction before it.
    let subject_at = join
        .as_str()
        .rfind(|c: char| c.is_whitespace() || c == ',' || c == ';');
    let second_start = join.start() + subject_at.map_or(0, |at| at + 1);
    let second = text[second_start..]
        .trim_start_matches(|c: char| c.is_whitespace())
        .trim();
    let second = second
        .strip_prefix("also ")
        .or_else(|| second.strip_prefix("Also "))
        .unwrap_or(second);
    let words = |part: &str| part.split_whitespace().count();
    if words(first) < 3 || words(second) < 3 {
        return None;
    }
    let first_kind = lasting_statement(first, to_assistant)?;
    let second_kind = lasting_statement(second, to_assistant)?;
    Some([(first, first_kind), (second, second_kind)])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn user(content: &str) -> SegmentTurn {
        SegmentTurn {
            role: SpeakerRole::User,
            content: content.to_owned(),
        }
    }

    fn assistant(content: &str) -> SegmentTurn {
        SegmentTurn {
            role: SpeakerRole::Assistant,
            content: content.to_owned(),
        }
    }

    #[test]
    fn a_news_opener_is_not_part_of_the_fact() {
        let facts = extract_facts(&[user("Big news: we moved to Lisbon last month.")]);
        let texts: Vec<&str> = facts.iter().map(|f| f.text.as_str()).collect();
        assert_eq!(texts.len(), 1, "{texts:?}");
        assert!(!texts[0].starts_with("Big news"), "{texts:?}");
        assert!(texts[0].contains("moved to Lisbon"), "{texts:?}");
    }

    #[test]
    fn a_sentence_of_two_statements_is_two_facts() {
        let facts = extract_facts(&[user(
            "I moved to Lisbon last year, and I work at a bakery in Alfama now.",
        )]);
        let texts: Vec<&str> = facts.iter().map(|f| f.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "I moved to Lisbon last year.",
                "I work at a bakery in Alfama now."
            ]
        );
        // A half that says nothing alone keeps the sentence whole.
        let facts = extract_facts(&[user(
            "I prefer green tea over coffee, and I'd say that's that.",
        )]);
        assert_eq!(facts.len(), 1, "{facts:?}");
    }

    #[test]
    fn reactions_and_exclamations_are_left_out_of_the_summary() {
        let turns = [
            user("Mia: Someone broke into my car in Leeds and took my camera bag."),
            assistant("Tom: That's horrible."),
            user("Mia: Thank god the memory cards were in my jacket pocket."),
            assistant("Tom: Mia, that's awful."),
            user("Mia: The police said it's the third car this month on that street."),
            assistant("Tom: Third!"),
            assistant("Tom: Wow."),
            user("Mia: I made a lemon drizzle cake to cheer myself up."),
            assistant("Tom: That cake sounds amazing, you have to send me the recipe."),
        ];
        let summary = extractive_episode(&turns).summary;
        assert!(summary.contains("camera bag"), "{summary}");
        assert!(summary.contains("third car this month"), "{summary}");
        for phatic in ["horrible", "awful", "Third!", "Wow", "sounds amazing"] {
            assert!(!summary.contains(phatic), "{phatic}: {summary}");
        }
        let chinese = [
            user("小林：我把那本书翻译完了，下个月出版。"),
            assistant("小王：这句话说得真好。"),
        ];
        let summary = extractive_episode(&chinese).summary;
        assert!(summary.contains("出版"), "{summary}");
        assert!(!summary.contains("说得真好"), "{summary}");
    }

    #[test]
    fn a_sentence_of_greetings_and_thanks_alone_is_left_out_of_the_summary() {
        let turns = [
            user("Mira: Hey Tomas, long time!"),
            assistant("Tomas: My pottery teacher moved the class to Thursday evenings."),
            user("Mira: Ines and I now fly to Reykjavik on the 16th."),
            assistant("Tomas: Thanks for telling me, have a great trip!"),
            user("Mira: Thanks for the recipe, I made the soup for Ines last night."),
        ];
        let summary = extractive_episode(&turns).summary;
        assert!(summary.contains("Thursday evenings"), "{summary}");
        assert!(summary.contains("the soup for Ines"), "{summary}");
        for phatic in ["long time", "Thanks for telling me"] {
            assert!(!summary.contains(phatic), "{phatic}: {summary}");
        }
    }

    #[test]
    fn a_summary_sentence_says_who_spoke_when_the_greeting_before_it_is_left_out() {
        let turns = [
            user("Nate: Hey Joanna! How was the weekend?"),
            assistant(
                "Joanna: Hey Nate! Pretty good, I finished the first draft of my screenplay.",
            ),
            user("Nate: I adopted a rescue greyhound called Pixel last month."),
            assistant("Joanna: I will. I am starting a pottery class on Tuesday evenings."),
        ];
        let summary = extractive_episode(&turns).summary;
        assert!(
            summary.contains("Joanna: Pretty good, I finished the first draft"),
            "{summary}"
        );
        assert!(
            summary.contains("Joanna: I am starting a pottery class"),
            "{summary}"
        );
        assert!(!summary.contains("Hey"), "{summary}");
    }

    #[test]
    fn what_the_user_tells_the_assistant_to_do_stays_in_the_summary() {
        let turns = [
            user("I'm planning a week in Lisbon with my sister in May."),
            assistant("Lovely! Shall I look at hotels in Alfama?"),
            user("Don't book anything until she confirms the dates on Friday."),
        ];
        let summary = extractive_episode(&turns).summary;
        assert!(summary.contains("Don't book anything"), "{summary}");
    }

    /// What the local rules store for a segment that established nothing.
    fn local_empty_summary() -> StructuredSummary {
        StructuredSummary {
            facts_are_plain: true,
            ..StructuredSummary::default()
        }
    }

    fn fact_texts(facts: &[ExtractedFact]) -> Vec<&str> {
        facts.iter().map(|fact| fact.text.as_str()).collect()
    }

    fn category_of_fact(facts: &[ExtractedFact], text: &str) -> Option<Category> {
        facts
            .iter()
            .find(|fact| fact.text == text)
            .map(|fact| fact.category)
    }

    fn trip_to_japan() -> Vec<SegmentTurn> {
        vec![
            user("Hi! I'm planning a two-week trip to Japan next April."),
            assistant(
                "That sounds wonderful! April is cherry blossom season, so book early. \
                 Are you thinking of Tokyo and Kyoto?",
            ),
            user("Yes, Tokyo first, then Kyoto. I prefer quiet places over crowded tourist spots."),
            assistant(
                "In Kyoto, the Philosopher's Path and Ohara are calmer than Arashiyama. \
                 In Tokyo, try Yanaka for an old-town feel.",
            ),
            user("My budget is about $3000 excluding flights."),
            user("I want to stay in a traditional ryokan in Kyoto for at least two nights."),
            assistant(
                "A ryokan in Kyoto typically costs $150-400 per night with dinner. \
                 Gion and Higashiyama have many.",
            ),
            user("What's the best way to get from Tokyo to Kyoto?"),
            assistant("The Shinkansen takes about 2 hours 15 minutes. A 7-day JR Pass covers it."),
            user("We decided to buy the JR Pass. I need to renew my passport before March."),
            user("thanks!"),
            assistant("You're welcome, enjoy the trip!"),
        ]
    }

    #[test]
    fn a_title_is_a_short_phrase_naming_the_topic_not_a_list_of_words() {
        let draft = extractive_episode(&[
            user("Hey! Big news: we moved to Lisbon last month, boxes everywhere."),
            assistant("Congratulations! How are you finding Lisbon so far?"),
            user("Lisbon is lovely, the light is amazing and the flat is near the river."),
            user("We still need a bigger sofa for the Lisbon flat."),
        ]);
        assert_eq!(draft.title, "Moved to Lisbon last month");
        let draft = extractive_episode(&[
            user("Caroline: I went to an LGBTQ support group yesterday and it was so powerful."),
            assistant("Melanie: Wow, Caroline, that's brave. What was the support group like?"),
            user("Caroline: The support group meets every Tuesday, everyone was so welcoming."),
        ]);
        assert!(!draft.title.contains(','), "{}", draft.title);
        assert!(draft.title.contains("support group"), "{}", draft.title);
        assert!(!draft.title.contains("Caroline"), "{}", draft.title);
    }

    #[test]
    fn a_number_with_a_thousands_comma_is_not_cut_into_a_title_fragment() {
        let draft = extractive_episode(&[
            user("We are finally renovating the kitchen this autumn."),
            user("Our contractor is Bruno Silva, and the budget is 18,000 euros."),
            assistant("I can help you track quotes against the 18,000 euro budget."),
        ]);
        assert!(!draft.title.starts_with("000"), "{}", draft.title);
        assert_eq!(
            headline_clauses("the budget is 18,000 euros, roughly").collect::<Vec<_>>(),
            ["the budget is 18,000 euros", "roughly"]
        );
        assert_eq!(
            headline_clauses("Kyoto, then Tokyo").collect::<Vec<_>>(),
            ["Kyoto", "then Tokyo"]
        );
    }

    #[test]
    fn english_trip_planning() {
        let draft = extractive_episode(&trip_to_japan());

        let title = draft.title.to_lowercase();
        assert!(
            title.contains("kyoto") || title.contains("japan"),
            "{}",
            draft.title
        );
        assert!(draft.title.chars().next().is_some_and(char::is_uppercase));

        for statement in [
            "I prefer quiet places over crowded tourist spots.",
            "I want to stay in a traditional ryokan in Kyoto for at least two nights.",
            "We decided to buy the JR Pass.",
            "I need to renew my passport before March.",
        ] {
            assert!(
                draft.summary.contains(statement),
                "{statement} in {}",
                draft.summary
            );
        }
        for chit_chat in ["Hi!", "thanks", "That sounds wonderful", "welcome"] {
            assert!(
                !draft.summary.contains(chit_chat),
                "{chit_chat} in {}",
                draft.summary
            );
        }
        // The assistant's question adds nothing the episode needs.
        assert!(
            !draft.summary.contains("Are you thinking"),
            "{}",
            draft.summary
        );

        let facts = &draft.facts;
        let expected = [
            (
                "I'm planning a two-week trip to Japan next April.",
                Category::Goal,
            ),
            (
                "I prefer quiet places over crowded tourist spots.",
                Category::Preference,
            ),
            (
                "My budget is about $3000 excluding flights.",
                Category::Fact,
            ),
            (
                "I want to stay in a traditional ryokan in Kyoto for at least two nights.",
                Category::Goal,
            ),
            ("We decided to buy the JR Pass.", Category::Decision),
            ("I need to renew my passport before March.", Category::Todo),
        ];
        assert_eq!(
            fact_texts(facts),
            expected.iter().map(|(text, _)| *text).collect::<Vec<_>>()
        );
        for (text, category) in expected {
            assert_eq!(category_of_fact(facts, text), Some(category), "{text}");
        }
        let ryokan = &facts[3];
        assert!(ryokan.keywords.contains(&"kyoto".to_owned()), "{ryokan:?}");
        assert!(
            facts
                .iter()
                .all(|fact| fact.keywords.len() <= MAX_FACT_KEYWORDS)
        );

        let structured = &draft.structured;
        assert_eq!(
            structured.preferences,
            ["I prefer quiet places over crowded tourist spots."]
        );
        assert_eq!(structured.decisions, ["We decided to buy the JR Pass."]);
        assert_eq!(
            structured.todos,
            ["I need to renew my passport before March."]
        );
        assert_eq!(structured.goals.len(), 2);
        assert_eq!(
            structured.facts,
            ["My budget is about $3000 excluding flights."]
        );
        for entity in ["kyoto", "tokyo", "jr pass"] {
            assert!(
                structured.entities.contains(&entity.to_owned()),
                "{entity} in {:?}",
                structured.entities
            );
        }
        assert!(!structured.entities.contains(&"thanks".to_owned()));
        assert!(structured.entities.len() <= MAX_ENTITIES);
    }

    /// A longer chat where the assistant talks most: the summary must still be the user's.
    fn learning_rust() -> Vec<SegmentTurn> {
        vec![
            user("hey"),
            assistant("Hello! How can I help you today?"),
            user(
                "I'm a Python developer and my goal is to learn Rust this year. \
                 My new team at work writes all its services in Rust.",
            ),
            assistant(
                "Great choice! Rust rewards a structured approach. Start with the Rust Book, \
                 chapters 1 to 10, then do the Rustlings exercises. The borrow checker is the \
                 part most Python developers find hardest, because Python never asks who owns \
                 a value. Expect a few weeks before ownership feels natural.\n\n\
                 Here is the classic first error:\n\
                 ```rust\n\
                 let s = String::from(\"hi\");\n\
                 let t = s;\n\
                 println!(\"{s}\"); // error: borrow of moved value\n\
                 ```\n\
                 Cloning or borrowing with `&s` fixes it.",
            ),
            user("The borrow checker keeps rejecting my linked list. It's really frustrating."),
            assistant(
                "Linked lists are notoriously hard in Rust; even experienced developers \
                 struggle. Use Vec or VecDeque for now, and read \"Learning Rust With Entirely \
                 Too Many Linked Lists\" later.",
            ),
            user("I prefer learning by building small projects rather than reading long books."),
            assistant(
                "Then build a command-line tool: a todo list, a log parser or a tiny grep. \
                 Each teaches ownership, error handling and crates like clap and serde.",
            ),
            user("Can you recommend a first project?"),
            assistant(
                "A log parser is a good first project: it touches files, strings and errors.",
            ),
            user(
                "Ok, I'll build a log parser for our nginx logs this weekend. \
                 Always show me the idiomatic version of any code I paste.",
            ),
            assistant("Will do. Paste your code whenever you're ready."),
            user("forget that"),
            user("thanks, that helps a lot"),
        ]
    }

    #[test]
    fn english_long_chat_summarises_the_user_and_skips_code_and_commands() {
        let draft = extractive_episode(&learning_rust());
        assert!(draft.title.contains("Rust"), "{}", draft.title);
        assert!(draft.title.chars().count() <= MAX_TITLE_CHARS);

        assert!(draft.summary.chars().count() <= MAX_SUMMARY_CHARS);
        assert!(
            draft.summary.contains("my goal is to learn Rust this year"),
            "{}",
            draft.summary
        );
        assert!(
            draft
                .summary
                .contains("I prefer learning by building small projects"),
            "{}",
            draft.summary
        );
        for absent in [
            "String::from",
            "println",
            "forget that",
            "hey",
            "thanks",
            "Hello",
        ] {
            assert!(
                !draft.summary.contains(absent),
                "{absent} in {}",
                draft.summary
            );
        }

        let facts = &draft.facts;
        assert_eq!(
            category_of_fact(
                facts,
                "I prefer learning by building small projects rather than reading long books."
            ),
            Some(Category::Preference)
        );
        assert_eq!(
            category_of_fact(
                facts,
                "Always show me the idiomatic version of any code I paste."
            ),
            Some(Category::Guideline)
        );
        assert_eq!(
            category_of_fact(
                facts,
                "I'll build a log parser for our nginx logs this weekend."
            ),
            Some(Category::Todo),
            "{facts:#?}"
        );
        assert!(
            facts
                .iter()
                .any(|fact| fact.text.starts_with("I'm a Python developer")
                    && fact.category == Category::Goal),
            "{facts:#?}"
        );
        for fact in facts {
            assert!(!fact.text.contains("recommend"), "a question: {fact:?}");
            assert!(
                !fact.text.contains("Rustlings"),
                "the assistant's: {fact:?}"
            );
            assert!(!fact.text.contains("forget"), "a command: {fact:?}");
        }
        assert!(draft.structured.entities.contains(&"rust".to_owned()));
    }

    fn trip_to_japan_in_chinese() -> Vec<SegmentTurn> {
        vec![
            user("你好！我打算明年四月去日本旅行，大概两个星期。"),
            assistant("听起来很棒！四月正好是樱花季，建议尽早预订酒店。你打算去东京和京都吗？"),
            user("对，先去东京，再去京都。我比较喜欢安静的地方，不喜欢人太多的景点。"),
            assistant("京都的哲学之道和大原都比较安静。东京可以去谷中一带走走。"),
            user("我的预算是两万元人民币，不包括机票。"),
            user("我想在京都住两晚传统的日式旅馆。"),
            assistant("京都的日式旅馆一晚大约一千到三千元，通常含晚餐。祇园和东山一带比较多。"),
            user("从东京到京都怎么走最方便？"),
            assistant("坐新干线大约两个小时十五分钟，七天的JR Pass可以覆盖。"),
            user("我们决定买JR Pass。我需要在三月之前更新护照。"),
            user("你能推荐几家京都的餐厅吗"),
            user("谢谢！"),
            assistant("不客气，祝旅途愉快！"),
        ]
    }

    #[test]
    fn chinese_trip_planning() {
        let draft = extractive_episode(&trip_to_japan_in_chinese());

        assert_eq!(draft.title, "我打算明年四月去日本旅行");
        for statement in [
            "我比较喜欢安静的地方，不喜欢人太多的景点。",
            "我想在京都住两晚传统的日式旅馆。",
            "我们决定买JR Pass。",
        ] {
            assert!(
                draft.summary.contains(statement),
                "{statement} in {}",
                draft.summary
            );
        }
        for absent in ["你好", "谢谢", "不客气", "你打算去东京和京都吗"] {
            assert!(
                !draft.summary.contains(absent),
                "{absent} in {}",
                draft.summary
            );
        }
        // Chinese sentences are joined without spaces.
        assert!(!draft.summary.contains("。 "), "{}", draft.summary);

        let facts = &draft.facts;
        let expected = [
            ("我打算明年四月去日本旅行，大概两个星期。", Category::Goal),
            (
                "我比较喜欢安静的地方，不喜欢人太多的景点。",
                Category::Preference,
            ),
            ("我的预算是两万元人民币，不包括机票。", Category::Fact),
            ("我想在京都住两晚传统的日式旅馆。", Category::Goal),
            ("我们决定买JR Pass。", Category::Decision),
            ("我需要在三月之前更新护照。", Category::Todo),
        ];
        assert_eq!(
            fact_texts(facts),
            expected.iter().map(|(text, _)| *text).collect::<Vec<_>>()
        );
        for (text, category) in expected {
            assert_eq!(category_of_fact(facts, text), Some(category), "{text}");
        }

        assert_eq!(draft.structured.decisions, ["我们决定买JR Pass。"]);
        assert_eq!(draft.structured.todos, ["我需要在三月之前更新护照。"]);
        for entity in ["京都", "东京", "日式旅馆"] {
            assert!(
                draft.structured.entities.contains(&entity.to_owned()),
                "{entity} in {:?}",
                draft.structured.entities
            );
        }
    }

    #[test]
    fn splits_sentences_around_numbers_abbreviations_and_links() {
        assert_eq!(
            sentences("The meeting is at 9.30 tomorrow. Bring coffee!"),
            ["The meeting is at 9.30 tomorrow.", "Bring coffee!"]
        );
        assert_eq!(
            sentences("I like languages with GC, e.g. Go and Java. Rust is different."),
            [
                "I like languages with GC, e.g. Go and Java.",
                "Rust is different."
            ]
        );
        assert_eq!(
            sentences("My doctor is Dr. Smith. She is great."),
            ["My doctor is Dr. Smith.", "She is great."]
        );
        assert_eq!(
            sentences("I moved to the U.S. in 2019. I live in Boston."),
            ["I moved to the U.S. in 2019.", "I live in Boston."]
        );
        assert_eq!(
            sentences("We moved to the U.S. I love it here."),
            ["We moved to the U.S.", "I love it here."]
        );
        assert_eq!(
            sentences("The docs are on example.com. Read them at www.rust-lang.org/learn first."),
            [
                "The docs are on example.com.",
                "Read them at www.rust-lang.org/learn first."
            ]
        );
        assert_eq!(
            sentences("我喜欢喝茶。你呢？我们明天见！"),
            ["我喜欢喝茶。", "你呢？", "我们明天见！"]
        );
        // Chinese typed with ASCII punctuation; a macro name is no sentence end.
        assert_eq!(
            sentences("我喜欢茶!你呢?我明天去上海.好的"),
            ["我喜欢茶!", "你呢?", "我明天去上海.", "好的"]
        );
        assert_eq!(
            sentences("sqlx的query!宏需要数据库"),
            ["sqlx的query!宏需要数据库"]
        );
        assert_eq!(
            sentences("first line\nsecond line\r\n\r\n- a bullet\n1. a numbered item"),
            ["first line", "second line", "a bullet", "a numbered item"]
        );
        assert_eq!(
            sentences("I like tea; I hate coffee. Really?! Yes..."),
            ["I like tea", "I hate coffee.", "Really?!", "Yes..."]
        );
        assert_eq!(
            sentences("He said \"stop.\" Then he left. Wait... what?"),
            ["He said \"stop.\"", "Then he left.", "Wait...", "what?"]
        );
        assert_eq!(
            sentences("Version 2.0.1 shipped at 10 a.m. yesterday; J. K. Rowling liked it."),
            [
                "Version 2.0.1 shipped at 10 a.m. yesterday",
                "J. K. Rowling liked it."
            ]
        );
        assert_eq!(
            sentences("Call me at 5 p.m. Then we talk."),
            ["Call me at 5 p.m.", "Then we talk."]
        );
        assert_eq!(sentences("  ... !! \n\n 🙂 "), Vec::<&str>::new());
        assert_eq!(sentences(""), Vec::<&str>::new());
    }

    #[test]
    fn plain_chinese_yields_no_metadata() {
        // `metadata_finds_nothing_in` skips such sentences; this fails if metadata learns to
        // find tags in them, and then the shortcut must go.
        for sentence in trip_to_japan_in_chinese()
            .iter()
            .flat_map(|turn| sentences(&turn.content))
            .filter(|sentence| metadata_finds_nothing_in(sentence))
        {
            assert_eq!(
                metadata::extract(sentence).tags,
                Vec::<String>::new(),
                "{sentence}"
            );
        }
        assert!(metadata_finds_nothing_in(
            "我比较喜欢安静的地方，不喜欢人太多的景点。"
        ));
        for has_something in [
            "我们决定买JR Pass。",
            "每周三开会",
            "我最喜欢《三体》",
            "3月5日出发",
        ] {
            assert!(!metadata_finds_nothing_in(has_something), "{has_something}");
        }
    }

    #[test]
    fn code_blocks_are_no_prose() {
        let text = "Try this:\n```rust\nlet x = 1.5; let y = 2;\n```\nIt works.";
        let prose: Vec<&str> = prose_regions(text)
            .into_iter()
            .flat_map(sentences)
            .collect();
        assert_eq!(prose, ["Try this:", "It works."]);
        // An unclosed fence hides the rest of the message.
        assert_eq!(prose_regions("text\n```\ncode"), ["text\n"]);
    }

    #[test]
    fn one_enormous_sentence_is_cut_at_a_word_boundary() {
        let sentence = format!(
            "I want to remember that {} and that is all.",
            "the project we are building needs a very careful migration plan".repeat(20)
        );
        let draft = extractive_episode(&[user(&sentence)]);
        assert!(draft.summary.chars().count() <= MAX_SUMMARY_CHARS);
        assert!(draft.summary.ends_with('…'), "{}", draft.summary);
        // Cut at a word boundary: the word before the ellipsis is whole.
        let last_word = draft
            .summary
            .trim_end_matches('…')
            .rsplit(' ')
            .next()
            .unwrap_or_default();
        assert!(
            sentence.split(' ').any(|word| word == last_word),
            "{last_word}"
        );
        assert!(!draft.title.is_empty());
        assert!(draft.title.chars().count() <= MAX_TITLE_CHARS);

        let chinese = "我想把这个非常长的句子".repeat(80);
        let draft = extractive_episode(&[user(&chinese)]);
        assert!(draft.summary.chars().count() <= MAX_SUMMARY_CHARS);
        assert!(draft.summary.ends_with('…'));
        assert!(draft.title.chars().count() <= MAX_CJK_TITLE_CHARS);

        let no_spaces = "x".repeat(2000);
        let draft = extractive_episode(&[user(&no_spaces)]);
        assert_eq!(draft.summary.chars().count(), MAX_SUMMARY_CHARS);
        assert_eq!(draft.title.chars().count(), MAX_TITLE_CHARS);
    }

    #[test]
    fn short_sentences_fit_whole_in_a_long_segment() {
        // Forty turns of distinct statements: the summary keeps whole sentences only.
        let turns: Vec<SegmentTurn> = (0..40)
            .map(|n| {
                if n % 2 == 0 {
                    user(&format!(
                        "I prefer the quiet library number {n} for studying Rust in the morning."
                    ))
                } else {
                    assistant(&format!(
                        "Library {n} opens at 8 and has good desks for Rust."
                    ))
                }
            })
            .collect();
        let draft = extractive_episode(&turns);
        assert!(draft.summary.chars().count() <= MAX_SUMMARY_CHARS);
        assert!(!draft.summary.contains('…'));
        for sentence in sentences(&draft.summary) {
            assert!(
                turns.iter().any(|turn| turn.content == sentence),
                "{sentence} was cut"
            );
        }
        assert_eq!(draft.facts.len(), 20);
    }

    #[test]
    fn chit_chat_only_gives_its_first_sentence_as_title_and_no_facts() {
        let draft = extractive_episode(&[
            user("hi"),
            assistant("Hello! How can I help you today?"),
            user("thanks!"),
            assistant("You're welcome!"),
        ]);
        assert_eq!(draft.title, "Hi");
        assert_eq!(draft.summary, "hi thanks!");
        assert!(draft.facts.is_empty());
        assert_eq!(draft.structured, local_empty_summary());

        let draft = extractive_episode(&[user("你好"), user("谢谢！"), assistant("不客气")]);
        assert_eq!(draft.title, "你好");
        assert!(draft.facts.is_empty());
    }

    #[test]
    fn an_empty_segment_is_untitled() {
        for turns in [
            vec![],
            vec![user("   \n "), assistant("")],
            vec![user("🙂👍")],
        ] {
            let draft = extractive_episode(&turns);
            assert_eq!(draft.title, UNTITLED);
            assert_eq!(draft.summary, "");
            assert!(draft.facts.is_empty());
            assert_eq!(draft.structured, local_empty_summary());
        }
    }

    #[test]
    fn personal_facts_without_a_category_signal_are_facts() {
        let facts = extract_facts(&[
            user(
                "I live in Lisbon. I work at Google as a data engineer. I'm 34 years old. \
                 My sister's name is Ana. I have two cats named Miso and Tofu.",
            ),
            user("我住在上海。我在腾讯工作。我的生日是五月三号。"),
            user("The weather is nice. 今天天气不错。"),
        ]);
        assert_eq!(
            fact_texts(&facts),
            [
                "I live in Lisbon.",
                "I work at Google as a data engineer.",
                "I'm 34 years old.",
                "My sister's name is Ana.",
                "I have two cats named Miso and Tofu.",
                "我住在上海。",
                "我在腾讯工作。",
                "我的生日是五月三号。",
            ]
        );
        assert!(facts.iter().all(|fact| fact.category == Category::Fact));
        let work = &facts[1];
        assert!(work.keywords.contains(&"google".to_owned()), "{work:?}");
    }

    #[test]
    fn a_fact_begins_with_what_it_states_not_with_the_reply_around_it() {
        let facts = extract_facts(&[
            user("Yes, and my manager is Alice Chen, she approves travel."),
            user("Also I live in Lisbon now."),
        ]);
        assert_eq!(
            fact_texts(&facts),
            [
                "my manager is Alice Chen, she approves travel.",
                "I live in Lisbon now.",
            ]
        );
    }

    #[test]
    fn local_rules_fill_gaps_in_the_importance_rules() {
        let facts = extract_facts(&[
            user("我想在东京住一个月。我明天把报告发给老板。我想了想，还是算了。"),
            user("Always show me the idiomatic version. Never mind, I'm a bit tired."),
        ]);
        let categorised: Vec<(&str, Category)> = facts
            .iter()
            .map(|fact| (fact.text.as_str(), fact.category))
            .collect();
        assert_eq!(
            categorised,
            [
                ("我想在东京住一个月。", Category::Goal),
                ("我明天把报告发给老板。", Category::Todo),
                ("Always show me the idiomatic version.", Category::Guideline),
            ]
        );
    }

    #[test]
    fn questions_commands_short_sentences_and_the_assistant_state_no_facts() {
        let facts = extract_facts(&[
            user("Do you think I should learn Go?"),
            user("How do I prefer to travel"),
            user("Can I always pay by card in Japan?"),
            user("Remember that I'm allergic to peanuts."),
            user("forget that"),
            user("pin this"),
            user("I love it."),
            user("我喜欢。"),
            user("你能推荐几家我会喜欢的餐厅吗"),
            user("记住我的护照在抽屉里"),
            assistant("I prefer to answer in English. I will remind you tomorrow."),
            SegmentTurn {
                role: SpeakerRole::System,
                content: "You always answer politely. I prefer short answers.".to_owned(),
            },
        ]);
        assert!(facts.is_empty(), "{facts:#?}");
    }

    #[test]
    fn repeated_facts_are_kept_once_with_one_full_stop() {
        let facts = extract_facts(&[
            user("I prefer window seats!!"),
            user("i prefer window seats"),
            user("I prefer window seats."),
            user("我喜欢靠窗的座位"),
        ]);
        assert_eq!(
            fact_texts(&facts),
            ["I prefer window seats.", "我喜欢靠窗的座位。"]
        );
    }

    #[test]
    fn the_same_input_gives_the_same_episode() {
        let first = extractive_episode(&learning_rust());
        for _ in 0..5 {
            assert_eq!(extractive_episode(&learning_rust()), first);
        }
        let chinese = extractive_episode(&trip_to_japan_in_chinese());
        assert_eq!(extractive_episode(&trip_to_japan_in_chinese()), chinese);
    }

    proptest! {
        #[test]
        fn limits_hold_for_any_input(
            turns in prop::collection::vec(
                (
                    any::<bool>(),
                    prop_oneof![
                        any::<String>(),
                        "[a-zA-Z0-9 .,;!?'\n\u{4e00}-\u{4e40}。！？；，-]{0,400}",
                        "(I (prefer|want to|will|live in|decided) [a-z ]{0,30}[.!?] ){0,12}",
                    ],
                ),
                0..12,
            )
        ) {
            let turns: Vec<SegmentTurn> = turns
                .into_iter()
                .map(|(by_user, content)| SegmentTurn {
                    role: if by_user { SpeakerRole::User } else { SpeakerRole::Assistant },
                    content,
                })
                .collect();
            let draft = extractive_episode(&turns);
            prop_assert!(!draft.title.is_empty());
            prop_assert!(draft.title.chars().count() <= MAX_TITLE_CHARS);
            prop_assert!(draft.summary.chars().count() <= MAX_SUMMARY_CHARS);
            prop_assert!(draft.structured.entities.len() <= MAX_ENTITIES);
            for fact in &draft.facts {
                prop_assert!(!fact.text.trim().is_empty());
                prop_assert!(fact.keywords.len() <= MAX_FACT_KEYWORDS);
            }
        }

        #[test]
        fn sentences_are_trimmed_non_empty_slices(text in any::<String>()) {
            for sentence in sentences(&text) {
                prop_assert!(!sentence.is_empty());
                prop_assert_eq!(sentence, sentence.trim());
                prop_assert!(text.contains(sentence));
            }
        }
    }
}

#[cfg(test)]
mod established_tests {
    use super::*;

    #[test]
    fn a_named_speakers_move_stays_a_fact_of_theirs_through_the_stored_summary() {
        let turns = [
            SegmentTurn {
                role: SpeakerRole::User,
                content: "Maya: Did you find a flat yet?".into(),
            },
            SegmentTurn {
                role: SpeakerRole::Assistant,
                content: "Theo: By the way, I moved to Lisbon last month.".into(),
            },
        ];
        let stored = serde_json::to_value(extractive_episode(&turns).structured).unwrap();
        let summary: StructuredSummary = serde_json::from_value(stored).unwrap();
        assert_eq!(
            summary.established(),
            [(
                "Theo: I moved to Lisbon last month.".to_owned(),
                Category::Fact
            )]
        );
    }
}

#[cfg(test)]
mod long_sentence_tests {
    use super::*;

    #[test]
    fn a_sentence_longer_than_a_paragraph_is_no_fact() {
        let blob = format!("I love {}", "long pasted words ".repeat(80));
        let turns = [SegmentTurn {
            role: SpeakerRole::User,
            content: blob,
        }];
        assert!(extractive_episode(&turns).facts.is_empty());
    }
}
