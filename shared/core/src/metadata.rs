//! Metadata extraction without an LLM: tags (entities and keyphrases) from a set of rule-based
//! detectors, each with its own confidence. `metadata_confidence` is the mean confidence of the
//! detections, clamped to [0, 1] (0 when nothing was detected) and rounded to hundredths.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::Regex;

use crate::normalize::{Token, tokenize};

/// At most this many tags are derived from one text.
pub const MAX_DERIVED_TAGS: usize = 12;

/// What the detectors found in a text.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Metadata {
    /// Lowercased tags, most confident first, without duplicates.
    pub tags: Vec<String>,
    /// Mean detector confidence, in [0, 1], in hundredths.
    pub confidence: f64,
}

/// One detection: a tag and the confidence of the detector that produced it.
#[derive(Debug, Clone, PartialEq)]
struct Detection {
    tag: String,
    confidence: f64,
}

struct Detector {
    pattern: Regex,
    confidence: f64,
}

fn detector(pattern: &str, confidence: f64) -> Detector {
    Detector {
        pattern: Regex::new(pattern).expect("valid metadata detector"),
        confidence,
    }
}

/// Pattern detectors; the first capture group (or the whole match) becomes the tag.
static PATTERN_DETECTORS: LazyLock<Vec<Detector>> = LazyLock::new(|| {
    vec![
        // #hashtags and @mentions are tags by the author's own hand.
        detector(r"(?:^|\s)#([\p{L}\p{N}_\-]{2,40})", 0.95),
        detector(r"(?:^|\s)@([\p{L}\p{N}_\-.]{2,40})", 0.9),
        // Email addresses and web domains.
        detector(
            r"\b([A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,})\b",
            0.95,
        ),
        detector(
            r"(?i)\b(?:https?://)?(?:www\.)?((?:[a-z0-9\-]+\.)+(?:com|org|net|io|dev|ai|edu|gov|cn|de|uk|fr|jp))\b",
            0.85,
        ),
        // Dates, weekdays, months and clock times.
        detector(r"\b(\d{4}-\d{2}-\d{2})\b", 0.9),
        detector(
            r"(?i)\b(monday|tuesday|wednesday|thursday|friday|saturday|sunday|january|february|march|april|june|july|august|september|october|november|december)s?\b",
            0.8,
        ),
        detector(r"(?i)\b(\d{1,2}(?::\d{2})?\s?(?:am|pm))\b", 0.8),
        detector(
            r"(星期[一二三四五六日天]|周[一二三四五六日]|\d{1,2}月\d{1,2}[日号])",
            0.8,
        ),
        // Quoted titles and names: "Dune", 《三体》, 「东京」.
        detector(r#"[“"]([^“”"]{2,40})[”"]"#, 0.75),
        detector(r"[《「『]([^》」』]{1,30})[》」』]", 0.85),
        // Money and quantities with units.
        detector(
            r"(?i)([$€£¥]\s?\d[\d,.]*|\d[\d,.]*\s?(?:usd|eur|gbp|rmb|元|美元|km|kg|miles|hours|minutes))",
            0.7,
        ),
    ]
});

/// Capitalized spans not at the start of a sentence: names of people, places, products.
static CAPITALIZED_SPAN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b\p{Lu}[\p{L}\p{N}'\-]*(?:\s+(?:of\s+|de\s+|van\s+)?\p{Lu}[\p{L}\p{N}'\-]*)*")
        .expect("valid capitalized span regex")
});

const MULTI_WORD_ENTITY_CONFIDENCE: f64 = 0.75;
const SINGLE_WORD_ENTITY_CONFIDENCE: f64 = 0.65;
const KEYPHRASE_CONFIDENCE: f64 = 0.4;
const MAX_KEYPHRASES: usize = 3;

const STOPWORDS: &[&str] = &[
    "a",
    "about",
    "above",
    "after",
    "again",
    "all",
    "also",
    "always",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "being",
    "but",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "doing",
    "don't",
    "down",
    "during",
    "each",
    "every",
    "few",
    "for",
    "from",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "him",
    "his",
    "how",
    "i",
    "i'm",
    "i'll",
    "i've",
    "if",
    "in",
    "into",
    "is",
    "it",
    "it's",
    "its",
    "just",
    "like",
    "me",
    "more",
    "most",
    "my",
    "myself",
    "never",
    "no",
    "not",
    "now",
    "of",
    "on",
    "once",
    "only",
    "or",
    "other",
    "our",
    "out",
    "over",
    "own",
    "please",
    "prefer",
    "really",
    "remember",
    "same",
    "she",
    "should",
    "so",
    "some",
    "such",
    "than",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "usually",
    "very",
    "want",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "why",
    "will",
    "with",
    "would",
    "you",
    "your",
    "yours",
    "love",
    "hate",
    "need",
    "going",
    "thing",
    "things",
    "much",
    "many",
    "lot",
    "make",
    "made",
    "get",
    "got",
    "let",
    "know",
    "think",
    "today",
    "tomorrow",
    "yesterday",
    "week",
    "year",
    "years",
    "time",
];

fn is_stopword(word: &str) -> bool {
    STOPWORDS.contains(&word)
}

/// Runs every detector over the text as the user gave it.
pub fn extract(text: &str) -> Metadata {
    let mut detections: Vec<Detection> = Vec::new();

    for detector in PATTERN_DETECTORS.iter() {
        for captures in detector.pattern.captures_iter(text) {
            let matched = captures
                .get(1)
                .or_else(|| captures.get(0))
                .map(|m| m.as_str());
            if let Some(tag) = matched.map(clean_tag).filter(|tag| !tag.is_empty()) {
                detections.push(Detection {
                    tag,
                    confidence: detector.confidence,
                });
            }
        }
    }

    detections.extend(capitalized_entities(text));
    detections.extend(keyphrases(text, &detections));

    // Keep the most confident detection of each tag, most confident first, stable otherwise.
    let mut best: Vec<Detection> = Vec::new();
    for detection in detections {
        match best.iter_mut().find(|kept| kept.tag == detection.tag) {
            Some(kept) if kept.confidence < detection.confidence => *kept = detection,
            Some(_) => {}
            None => best.push(detection),
        }
    }
    best.sort_by(|a, b| b.confidence.total_cmp(&a.confidence));
    best.truncate(MAX_DERIVED_TAGS);

    let confidence = if best.is_empty() {
        0.0
    } else {
        let mean = best.iter().map(|d| d.confidence).sum::<f64>() / best.len() as f64;
        to_hundredths(mean).clamp(0.0, 1.0)
    };
    Metadata {
        tags: best.into_iter().map(|d| d.tag).collect(),
        confidence,
    }
}

/// The detectors' confidences are hundredths; their mean is kept to the same precision. Summing
/// binary fractions is inexact (three keyphrases at 0.4 average to 0.4000000000000001), and the
/// value is shown to clients and compared against thresholds, so it is rounded: the quotient of
/// two exact integers is the double nearest the decimal, which prints as that decimal.
fn to_hundredths(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

fn clean_tag(raw: &str) -> String {
    let trimmed = raw
        .trim()
        .trim_matches(|c: char| c.is_ascii_punctuation() && c != '$');
    // Controls and invisible characters would make a tag that import (which validates tags)
    // refuses.
    trimmed
        .split(|c: char| c.is_whitespace() || c.is_control())
        .map(|word| word.replace(crate::normalize::is_default_ignorable, ""))
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Capitalized words and spans that do not merely start a sentence. "I" is never an entity.
fn capitalized_entities(text: &str) -> Vec<Detection> {
    let mut found = Vec::new();
    for span in CAPITALIZED_SPAN.find_iter(text) {
        let words: Vec<&str> = span.as_str().split_whitespace().collect();
        let before = text[..span.start()].trim_end();
        let starts_sentence =
            before.is_empty() || before.ends_with(['.', '!', '?', ':', '\n', '。', '！', '？']);
        let words: Vec<&str> = if starts_sentence {
            words[1..].to_vec()
        } else {
            words
        };
        let words: Vec<&str> = words
            .into_iter()
            .skip_while(|word| matches!(*word, "I" | "I'm" | "I'll" | "I've" | "I'd"))
            .collect();
        if words.is_empty() || (words.len() == 1 && is_stopword(&words[0].to_lowercase())) {
            continue;
        }
        let confidence = if words.len() > 1 {
            MULTI_WORD_ENTITY_CONFIDENCE
        } else {
            SINGLE_WORD_ENTITY_CONFIDENCE
        };
        found.push(Detection {
            tag: clean_tag(&words.join(" ")),
            confidence,
        });
    }
    found
}

/// The most frequent content words not already covered by another detection.
fn keyphrases(text: &str, already: &[Detection]) -> Vec<Detection> {
    // Lowercased, without URLs and citation markers: "https" is no keyphrase.
    let lowered = crate::normalize::normalize_without_links(text);
    let mut counts: HashMap<&str, (usize, usize)> = HashMap::new();
    for (position, token) in tokenize(&lowered).into_iter().enumerate() {
        let Token::Word(word) = token else { continue };
        if word.chars().count() < 4 || is_stopword(word) || word.chars().all(|c| c.is_numeric()) {
            continue;
        }
        counts.entry(word).or_insert((0, position)).0 += 1;
    }
    let mut ranked: Vec<(&str, (usize, usize))> = counts.into_iter().collect();
    // Most frequent first, then earliest.
    ranked.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.1.1.cmp(&b.1.1)));
    ranked
        .into_iter()
        .filter(|(word, _)| {
            !already
                .iter()
                .any(|d| d.tag.split(' ').any(|part| part == *word))
        })
        .take(MAX_KEYPHRASES)
        .map(|(word, _)| Detection {
            tag: word.to_owned(),
            confidence: KEYPHRASE_CONFIDENCE,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_entities_dates_and_keyphrases() {
        let metadata =
            extract("My sister Maria Lopez moved to New York on 2025-03-01 for a job at Google.");
        for expected in ["maria lopez", "new york", "2025-03-01", "google"] {
            assert!(
                metadata.tags.contains(&expected.to_owned()),
                "{expected} in {:?}",
                metadata.tags
            );
        }
        assert!(
            metadata.tags.contains(&"sister".to_owned()),
            "{:?}",
            metadata.tags
        );
        assert!(metadata.confidence > 0.6, "{}", metadata.confidence);
        assert!(metadata.confidence <= 1.0);
    }

    #[test]
    fn links_yield_no_keyphrases_and_tags_hold_no_controls() {
        let metadata = extract("https://github.com/rust-lang/rust");
        for word in ["https", "github", "rust"] {
            assert!(
                !metadata.tags.contains(&word.to_owned()),
                "{:?}",
                metadata.tags
            );
        }
        assert_eq!(
            clean_tag("  《Dune\u{7}\u{200b} Messiah》 "),
            "《dune messiah》"
        );
    }

    #[test]
    fn sentence_starts_and_pronouns_are_not_entities() {
        let metadata = extract("The weather is nice. I think so.");
        assert!(
            !metadata.tags.iter().any(|t| t == "the" || t == "i"),
            "{:?}",
            metadata.tags
        );
    }

    #[test]
    fn hashtags_mentions_and_times() {
        let metadata = extract("standup every Tuesday at 10am with @alice #platform");
        for expected in ["tuesday", "10am", "alice", "platform"] {
            assert!(
                metadata.tags.contains(&expected.to_owned()),
                "{expected} in {:?}",
                metadata.tags
            );
        }
    }

    #[test]
    fn chinese_titles_and_dates() {
        let metadata = extract("我最喜欢的书是《三体》，每周三晚上读");
        assert!(
            metadata.tags.contains(&"三体".to_owned()),
            "{:?}",
            metadata.tags
        );
        assert!(
            metadata.tags.contains(&"周三".to_owned()),
            "{:?}",
            metadata.tags
        );
        assert!(metadata.confidence >= 0.8);
    }

    #[test]
    fn nothing_detected_means_zero_confidence() {
        let metadata = extract("ok");
        assert!(metadata.tags.is_empty());
        assert_eq!(metadata.confidence, 0.0);
    }

    #[test]
    fn the_mean_confidence_is_an_exact_decimal() {
        // Three keyphrases at 0.4: summed in binary they average to 0.4000000000000001.
        let metadata = extract("the database migration failed twice during deployment");
        assert_eq!(metadata.tags.len(), 3, "{:?}", metadata.tags);
        assert_eq!(metadata.confidence, 0.4);
        assert_eq!(metadata.confidence.to_string(), "0.4");
        // A mean that is no exact hundredth is rounded to one: (0.95 + 0.4 + 0.4) / 3.
        let metadata = extract("#deploy the migration failed");
        assert_eq!(metadata.tags, ["deploy", "migration", "failed"]);
        assert_eq!(metadata.confidence.to_string(), "0.58");
    }

    #[test]
    fn keyphrases_alone_are_not_confident() {
        let metadata = extract("the database migration failed twice during deployment");
        assert!(!metadata.tags.is_empty());
        assert!(metadata.confidence < 0.6, "{}", metadata.confidence);
    }
}
