//! Normalization for fingerprinting. The stored text always stays as the user gave it; this form
//! only feeds SimHash, so that case, links, citation markers and spacing do not make two
//! statements of the same thing look different.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfkc_quick};

static URL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?:https?://|ftp://|www\.)[^\s<>()\[\]{}]+").expect("valid url regex")
});

/// Citation markers: `[1]`, `[12, 13]`, `[^3]`, `【2】`, `(Smith, 2020)`, `(Smith et al. 2019)`.
static CITATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?x)
        \[\^?\d+(?:\s*[,\u{2013}-]\s*\d+)*\]
        | 【\d+(?:[,，]\s*\d+)*】
        | \(\s*[A-Z][A-Za-z'\-]+(?:\s+et\s+al\.?)?(?:\s*(?:&|and)\s*[A-Z][A-Za-z'\-]+)?,?\s+\d{4}[a-z]?\s*\)
        ",
    )
    .expect("valid citation regex")
});

/// Brings text to Unicode NFKC, lowercases it, removes URLs and citation markers, and folds runs
/// of whitespace into one space.
///
/// NFKC first, so that the composed and decomposed forms of "café" (keyboards differ) and
/// full-width letters are the same text to SimHash, to merging and to a Forget's tombstone.
/// Text that is nothing but links or citation markers keeps them: removing them would leave
/// every such text the same empty fingerprint, merging unrelated links into one memory.
pub fn normalize_for_fingerprint(text: &str) -> String {
    let canonical = canonical_form(text);
    let stripped = strip_links_and_citations(&canonical);
    if !has_word(&stripped) && has_word(&canonical) {
        return lowercase_and_fold_whitespace(&canonical);
    }
    stripped
}

/// The words a text says for itself: NFKC, lowercased, URLs and citation markers always removed
/// (for keyphrases, where "https" is never one).
pub fn normalize_without_links(text: &str) -> String {
    strip_links_and_citations(&canonical_form(text))
}

fn strip_links_and_citations(canonical: &str) -> String {
    // Citations first: the author-year form relies on capital letters.
    let without_citations = CITATION.replace_all(canonical, " ");
    let without_urls = URL.replace_all(&without_citations, " ");
    lowercase_and_fold_whitespace(&without_urls)
}

fn has_word(text: &str) -> bool {
    text.chars().any(char::is_alphanumeric)
}

/// NFKC, without the characters that render as nothing: "pass\u{200b}word" is "password" to a
/// reader, so it is to the fingerprint and to a Forget's tombstone.
fn canonical_form(text: &str) -> Cow<'_, str> {
    let nfkc = if is_nfkc_quick(text.chars()) == IsNormalized::Yes {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(text.nfkc().collect::<String>())
    };
    if nfkc.chars().any(is_default_ignorable) {
        Cow::Owned(nfkc.chars().filter(|c| !is_default_ignorable(*c)).collect())
    } else {
        nfkc
    }
}

/// Characters that render as nothing and are no whitespace: format controls such as zero-width
/// spaces and joiners, direction marks, the soft hyphen, variation selectors, Hangul fillers.
pub fn is_default_ignorable(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}'
        | '\u{FFA0}' | '\u{1D173}'..='\u{1D17A}' | '\u{E0000}'..='\u{E0FFF}')
}

fn lowercase_and_fold_whitespace(text: &str) -> String {
    text.to_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether a character is written without spaces between words (Chinese, Japanese kana, Korean
/// syllables are spaced but short): such runs are split into characters for features.
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF     // Hiragana, Katakana
        | 0x3400..=0x4DBF   // CJK Extension A
        | 0x4E00..=0x9FFF   // CJK Unified Ideographs
        | 0xF900..=0xFAFF   // CJK Compatibility Ideographs
        | 0xAC00..=0xD7AF   // Hangul syllables
        | 0x20000..=0x2A6DF // CJK Extension B
    )
}

/// A token of normalized text: a word of letters/digits, or one CJK character.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token<'a> {
    Word(&'a str),
    Cjk(&'a str),
}

impl<'a> Token<'a> {
    pub fn as_str(&self) -> &'a str {
        match self {
            Token::Word(word) | Token::Cjk(word) => word,
        }
    }
}

/// Splits text into words (runs of letters and digits, apostrophes inside a word kept) and
/// single CJK characters; punctuation and spacing separate tokens.
pub fn tokenize(text: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::new();
    let mut word_start: Option<usize> = None;
    let mut chars = text.char_indices().peekable();
    while let Some((index, c)) = chars.next() {
        if is_cjk(c) {
            if let Some(start) = word_start.take() {
                tokens.push(Token::Word(&text[start..index]));
            }
            tokens.push(Token::Cjk(&text[index..index + c.len_utf8()]));
            continue;
        }
        let inner_apostrophe = (c == '\'' || c == '’')
            && word_start.is_some()
            && chars
                .peek()
                .is_some_and(|(_, next)| next.is_alphanumeric() && !is_cjk(*next));
        if c.is_alphanumeric() || inner_apostrophe {
            word_start.get_or_insert(index);
        } else if let Some(start) = word_start.take() {
            tokens.push(Token::Word(&text[start..index]));
        }
    }
    if let Some(start) = word_start {
        tokens.push(Token::Word(&text[start..]));
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercases_folds_whitespace_and_drops_urls() {
        assert_eq!(
            normalize_for_fingerprint("  I  prefer\tDark Mode\n see https://example.com/x?y=1 "),
            "i prefer dark mode see"
        );
        assert_eq!(
            normalize_for_fingerprint("Docs at www.rust-lang.org now"),
            "docs at now"
        );
    }

    #[test]
    fn drops_citation_markers() {
        assert_eq!(
            normalize_for_fingerprint("Rust is memory safe [1][2, 3] (Smith et al. 2019)."),
            "rust is memory safe ."
        );
        assert_eq!(normalize_for_fingerprint("见文献【12】。"), "见文献 。");
        assert_eq!(
            normalize_for_fingerprint("footnote[^4] here"),
            "footnote here"
        );
    }

    #[test]
    fn composed_decomposed_and_full_width_forms_normalize_alike() {
        let composed = "Zo\u{eb}'s caf\u{e9} is on Rua A\u{e7}ores";
        let decomposed = "Zoe\u{308}'s cafe\u{301} is on Rua Ac\u{327}ores";
        assert_ne!(composed, decomposed);
        assert_eq!(
            normalize_for_fingerprint(composed),
            normalize_for_fingerprint(decomposed)
        );
        assert_eq!(
            normalize_for_fingerprint(
                "\u{ff44}\u{ff41}\u{ff52}\u{ff4b} \u{ff4d}\u{ff4f}\u{ff44}\u{ff45}"
            ),
            "dark mode"
        );
        // Zero-width spaces and soft hyphens inside a word do not make it another word.
        assert_eq!(
            normalize_for_fingerprint("my pass\u{200b}word is on the fri\u{ad}dge"),
            "my password is on the fridge"
        );
    }

    #[test]
    fn text_of_links_or_citations_only_keeps_them() {
        assert_eq!(
            normalize_for_fingerprint("https://GitHub.com/rust-lang/rust"),
            "https://github.com/rust-lang/rust"
        );
        assert_ne!(
            normalize_for_fingerprint("https://bank.example.com/login"),
            normalize_for_fingerprint("www.mydoctor.org")
        );
        assert_eq!(normalize_for_fingerprint(" [1] "), "[1]");
        assert_eq!(
            normalize_without_links("https://github.com/rust-lang/rust"),
            ""
        );
        // With words beside them, links and citations are still dropped.
        assert_eq!(normalize_for_fingerprint("see https://x.io [2]"), "see");
    }

    #[test]
    fn tokenizes_words_and_cjk_characters() {
        let tokens: Vec<&str> = tokenize("I don't like 绿茶, ok?")
            .iter()
            .map(Token::as_str)
            .collect();
        assert_eq!(tokens, vec!["I", "don't", "like", "绿", "茶", "ok"]);
    }
}
