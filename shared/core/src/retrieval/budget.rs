//! The token budget of a retrieval's Markdown, counted with a real BPE tokenizer (o200k_base, the
//! encoding of current OpenAI models; other LLMs' tokenizers land within a few percent of it).
//!
//! Parts are taken by how well they answer the query (each part's relevance on [0, 1]): the
//! sections, each in its ranking's order, are merged by relevance, so that the budget goes to the
//! evidence whichever section holds it (issue 38: taken alternately, twenty facts of noise came
//! before the second episode's lines). An episode
//! has several renderings, the fullest first (its excerpt, the lines that answer the query, its
//! best line, its summary) and gets the first that fits. (Giving every episode its best line
//! first and spending what is left on fuller renderings lost 9 points of evidence at 1,000
//! tokens on the dialogs: the answer is often in the best episode's other lines.) A part that
//! does not fit at all is left out; either way the response is marked truncated. The
//! assembled Markdown is counted once more at the end, and parts are dropped from the back should
//! joining them have cost more than their separate counts.
//!
//! Counting is a line at a time, each distinct line once ([`LineTokens`]): an episode's
//! renderings repeat its heading and lines, and the assembled Markdown repeats every part taken.
//! Counting every rendering whole was a fifth of the retrieval service's CPU time at saturation
//! (`make bench-retrieval`, docs/benchmarks/README.md).

use std::collections::HashMap;
use std::sync::LazyLock;

use super::markdown::{EPISODIC_HEADING, SEMANTIC_HEADING, assemble};

/// The o200k vocabulary (the encoding of current OpenAI models), counted by the `bpe` crate's
/// encoder: the same counts as OpenAI's own tokenizer (tiktoken; the tests check it), about five
/// times faster than tiktoken-rs, which was a fifth of the retrieval service's CPU time at
/// saturation (docs/benchmarks/README.md). The crate loads it once, on first use.
fn tokenizer() -> &'static bpe_openai::Tokenizer {
    bpe_openai::o200k_base()
}

/// Default budget of a retrieval's Markdown.
pub const DEFAULT_TOKEN_BUDGET: u32 = 2_000;
/// The least budget a request or the configuration may set: room for a heading and a line.
pub const MIN_TOKEN_BUDGET: u32 = 50;
/// The greatest budget a request or the configuration may set.
pub const MAX_TOKEN_BUDGET: u32 = 32_000;

/// Loads the token counter's vocabulary now (about 100 ms of one core). Services
/// call it at start, on a blocking thread, before they report ready: otherwise the first request
/// that counts tokens loads it on the async runtime while every other request waits (the first
/// appends of the conversations benchmark waited up to 250 ms).
pub fn load_tokenizer() {
    tokenizer();
}

/// Tokens of a text, exactly. The encoder's time is linear in the text, unspaced text included:
/// tiktoken-rs merged each piece's bytes in time that grew with the square of its length, and
/// 8,192 unspaced CJK characters took 250 ms (issue 37), which needed long runs cut; this
/// encoder counts 65,536 of them in about 3 ms.
pub fn count_tokens(text: &str) -> usize {
    tokenizer().count(text)
}

/// Token counts of Markdown, a line at a time, each distinct line counted once and remembered:
/// exactly [`count_tokens`] of the whole text.
///
/// Why the sum of the lines is the count of the whole: the tokenizer first cuts text into pieces
/// by a pattern, then encodes each piece on its own. A line break followed by a character that is
/// neither whitespace nor `/` always ends a piece (no alternative of the pattern runs on past
/// it: a run of line breaks stops at the character, letters never take a line break as their
/// prefix, and a run of punctuation takes only line breaks and slashes after it), and the next
/// piece starts there whatever came before. So the text is cut at exactly those places, a blank
/// line staying with the line before it, and the pieces, hence the tokens, are the same as the
/// whole text's.
///
/// Beside its own, it looks lines up among those every earlier count of the process counted
/// ([`COUNTED_LINES`]).
#[derive(Debug, Default)]
pub struct LineTokens {
    counted: HashMap<Box<str>, usize>,
}

/// The bytes of lines whose counts the process keeps (with a little for each entry's keeping).
const COUNTED_LINES_BYTES: u64 = 16 * 1024 * 1024;

/// Lines any retrieval of this process counted, by their text. A space's lines and headings come
/// back in request after request (an assistant asks several questions within one conversation),
/// and counting a line costs microseconds where looking it up costs a fraction of one: the
/// counting was a sixteenth of the retrieval service's CPU time at saturation (issue 41). A count
/// depends on the text alone, so a count kept is never stale; the least used go first once the
/// lines kept pass [`COUNTED_LINES_BYTES`]. (quick_cache, not moka: moka's bookkeeping of each
/// read cost as much as counting the line again.)
static COUNTED_LINES: LazyLock<quick_cache::sync::Cache<Box<str>, usize, LineBytes>> =
    LazyLock::new(|| {
        quick_cache::sync::Cache::with_weighter(
            // Lines of a hundred-odd bytes, the usual.
            (COUNTED_LINES_BYTES / 192) as usize,
            COUNTED_LINES_BYTES,
            LineBytes,
        )
    });

/// What a kept line weighs: its bytes, and a little for its entry.
#[derive(Debug, Clone, Copy)]
struct LineBytes;

impl quick_cache::Weighter<Box<str>, usize> for LineBytes {
    fn weight(&self, line: &Box<str>, _tokens: &usize) -> u64 {
        line.len() as u64 + 64
    }
}

impl LineTokens {
    pub fn new() -> Self {
        Self::default()
    }

    /// Tokens of `text`, as [`count_tokens`] counts them.
    pub fn count(&mut self, text: &str) -> usize {
        lines_counted_apart(text)
            .map(|line| match self.counted.get(line) {
                Some(&tokens) => tokens,
                None => {
                    let tokens = COUNTED_LINES.get(line).unwrap_or_else(|| {
                        let tokens = count_tokens(line);
                        COUNTED_LINES.insert(line.into(), tokens);
                        tokens
                    });
                    self.counted.insert(line.into(), tokens);
                    tokens
                }
            })
            .sum()
    }
}

/// `text` cut after every line break followed by a character that is neither whitespace nor `/`
/// (see [`LineTokens`]): the cuts the tokenizer's pieces never cross.
fn lines_counted_apart(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < bytes.len() {
            at += 1;
            let cut = bytes[at - 1] == b'\n'
                && text[at..]
                    .chars()
                    .next()
                    .is_some_and(|next| !next.is_whitespace() && next != '/');
            if cut {
                let line = &text[start..at];
                start = at;
                return Some(line);
            }
        }
        (start < bytes.len()).then(|| {
            let line = &text[start..];
            start = bytes.len();
            line
        })
    })
}

/// A fact as the budget takes it: its Markdown line and how well it answers the query.
#[derive(Debug, Clone, PartialEq)]
pub struct FactPart {
    pub line: String,
    /// Its relevance on [0, 1]: parts are taken highest first.
    pub relevance: f64,
}

/// The renderings of an episode, the fullest first (its excerpt, the lines that answer the query,
/// its best line, its summary). At least one.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodePart {
    pub renderings: Vec<String>,
    /// Its relevance on [0, 1]: parts are taken highest first (an episode before a fact that
    /// answers as well).
    pub relevance: f64,
}

/// What fit: indexes into the inputs (in their original order) and the Markdown.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    pub facts: Vec<usize>,
    /// Index and which of its renderings was kept (0: the fullest).
    pub episodes: Vec<(usize, usize)>,
    pub markdown: String,
    pub tokens: usize,
    pub truncated: bool,
}

#[derive(Clone, Copy)]
enum Part {
    Fact(usize),
    Episode(usize),
}

/// Fits facts and episodes (each section best first, in the order the Markdown shows them) into
/// `budget` tokens. The two sections are merged by relevance: the next part taken is whichever
/// section's next part answers better (an episode on a tie), so each section keeps its own
/// ranking's order and neither crowds out the other's better answers.
pub fn fit(facts: &[FactPart], episodes: &[EpisodePart], budget: usize) -> Fitted {
    let finite = |value: f64| if value.is_finite() { value } else { 0.0 };
    let mut order: Vec<Part> = Vec::with_capacity(facts.len() + episodes.len());
    let (mut fact, mut episode) = (0, 0);
    while fact < facts.len() || episode < episodes.len() {
        let episode_first = match (facts.get(fact), episodes.get(episode)) {
            (Some(f), Some(e)) => finite(e.relevance) >= finite(f.relevance),
            (None, _) => true,
            (_, None) => false,
        };
        if episode_first {
            order.push(Part::Episode(episode));
            episode += 1;
        } else {
            order.push(Part::Fact(fact));
            fact += 1;
        }
    }
    let mut taking = Taking {
        budget,
        tokens: LineTokens::new(),
        used: 0,
        truncated: false,
        facts: Vec::new(),
        episodes: Vec::new(),
        order: Vec::new(),
    };
    for part in order {
        taking.take(part, facts, episodes);
    }
    taking.assemble(facts, episodes)
}

/// The parts taken so far, and the tokens they cost.
struct Taking {
    budget: usize,
    tokens: LineTokens,
    used: usize,
    truncated: bool,
    facts: Vec<usize>,
    /// Index and which of its renderings it has.
    episodes: Vec<(usize, usize)>,
    /// The order parts were taken in, to drop from the back if the final count is over.
    order: Vec<Part>,
}

impl Taking {
    /// Takes `part` if it fits (an episode in the fullest of its renderings that fits).
    fn take(&mut self, part: Part, facts: &[FactPart], episodes: &[EpisodePart]) {
        match part {
            Part::Fact(index) => {
                // The section's heading is paid with its first part.
                let overhead = if self.facts.is_empty() {
                    self.tokens.count(SEMANTIC_HEADING)
                } else {
                    0
                };
                let cost = overhead + self.tokens.count(&facts[index].line);
                if self.used + cost <= self.budget {
                    self.used += cost;
                    self.facts.push(index);
                    self.order.push(part);
                } else {
                    self.truncated = true;
                }
            }
            Part::Episode(index) => {
                // The heading and the blank lines between blocks.
                let overhead = if self.episodes.is_empty() {
                    self.tokens.count(EPISODIC_HEADING) + 2
                } else {
                    1
                };
                for (rendering, text) in episodes[index].renderings.iter().enumerate() {
                    let cost = overhead + self.tokens.count(text);
                    if self.used + cost <= self.budget {
                        self.used += cost;
                        self.episodes.push((index, rendering));
                        self.order.push(part);
                        return;
                    }
                    self.truncated = true;
                }
            }
        }
    }

    /// The Markdown of what was taken, each section in its order, counted once more: should
    /// joining the parts have cost more than their separate counts, parts are dropped from the
    /// back until it fits.
    fn assemble(mut self, facts: &[FactPart], episodes: &[EpisodePart]) -> Fitted {
        loop {
            self.facts.sort_unstable();
            self.episodes.sort_unstable();
            let fact_lines: Vec<String> =
                self.facts.iter().map(|&i| facts[i].line.clone()).collect();
            let blocks: Vec<String> = self
                .episodes
                .iter()
                .map(|&(i, rendering)| episodes[i].renderings[rendering].clone())
                .collect();
            let markdown = assemble(&fact_lines, &blocks);
            let tokens = self.tokens.count(&markdown);
            if tokens <= self.budget || self.order.is_empty() {
                return Fitted {
                    facts: self.facts,
                    episodes: self.episodes,
                    markdown,
                    tokens,
                    truncated: self.truncated,
                };
            }
            self.truncated = true;
            match self.order.pop() {
                Some(Part::Fact(index)) => self.facts.retain(|&i| i != index),
                Some(Part::Episode(index)) => self.episodes.retain(|&(i, _)| i != index),
                None => unreachable!("checked above"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(n: usize) -> Vec<FactPart> {
        (0..n)
            .map(|i| FactPart {
                line: format!("- [fact] The user mentioned item number {i} in a conversation (sources: 1 conversation)\n"),
                relevance: 1.0 - i as f64 / n as f64,
            })
            .collect()
    }

    fn episode(words: usize, details: usize) -> EpisodePart {
        let summary = "word ".repeat(words);
        let short = format!(
            "### Title [rank: 1, score: 0.500]\n**When:** yesterday\n**Summary:** {summary}\n"
        );
        let full = format!(
            "{short}\n**Details:**\n{}",
            "- user: \"detail line\"\n".repeat(details)
        );
        EpisodePart {
            renderings: vec![full, short],
            relevance: 0.5,
        }
    }

    #[test]
    fn everything_fits_in_a_large_budget() {
        let fitted = fit(&facts(3), &[episode(10, 2)], 2_000);
        assert_eq!(fitted.facts, vec![0, 1, 2]);
        assert_eq!(fitted.episodes, vec![(0, 0)]);
        assert!(!fitted.truncated);
        assert_eq!(fitted.tokens, count_tokens(&fitted.markdown));
    }

    #[test]
    fn a_small_budget_cuts_and_says_so_and_is_never_exceeded() {
        for budget in [0, 10, 40, 80, 150, 300] {
            let fitted = fit(&facts(20), &[episode(30, 40), episode(30, 0)], budget);
            assert!(fitted.truncated, "budget {budget}");
            if !fitted.facts.is_empty() || !fitted.episodes.is_empty() {
                assert!(
                    fitted.tokens <= budget,
                    "budget {budget}: {}",
                    fitted.tokens
                );
            }
        }
    }

    #[test]
    fn the_budget_goes_to_the_parts_that_answer_best_each_section_in_its_order() {
        let mut answering = episode(10, 0);
        answering.relevance = 0.9;
        let mut weak = episode(10, 0);
        weak.relevance = 0.1;
        // Facts of relevance 1, 0.67 and 0.33: the answering episode comes second, before the
        // weaker facts; the weak episode after them, and the budget is spent by then.
        let facts = facts(3);
        let budget = count_tokens(SEMANTIC_HEADING)
            + count_tokens(&facts[0].line)
            + count_tokens(&answering.renderings[0])
            + count_tokens(EPISODIC_HEADING)
            + 2
            + 5;
        let fitted = fit(&facts, &[answering, weak], budget);
        assert_eq!(fitted.facts, vec![0], "{}", fitted.markdown);
        assert_eq!(fitted.episodes, vec![(0, 0)], "{}", fitted.markdown);
        assert!(fitted.truncated);
        // Within a section its ranking's order holds, whatever the relevance says.
        let mut reversed = facts.clone();
        reversed.reverse();
        let one_fact = count_tokens(SEMANTIC_HEADING) + count_tokens(&reversed[0].line) + 2;
        assert_eq!(fit(&reversed, &[], one_fact).facts, vec![0]);
        // Ties: the episode first.
        let mut tied = episode(10, 0);
        tied.relevance = 1.0;
        let only_one = count_tokens(&tied.renderings[1]) + count_tokens(EPISODIC_HEADING) + 2;
        let fitted = fit(&facts[..1], &[tied], only_one);
        assert_eq!((fitted.episodes.len(), fitted.facts.len()), (1, 0));
    }

    #[test]
    fn an_episode_too_long_in_full_is_taken_in_its_best_line() {
        let lines = EpisodePart {
            renderings: vec![
                format!(
                    "### Lisbon\n{}",
                    "- Ana: a line of the talk that goes on and on\n".repeat(30)
                ),
                "### Lisbon\n- Maria: the offsite starts on Monday the 14th\n".to_owned(),
                "### Lisbon\n**Summary:** they talked\n".to_owned(),
            ],
            relevance: 1.0,
        };
        let fitted = fit(&[], &[lines], 60);
        assert_eq!(fitted.episodes, vec![(0, 1)], "{}", fitted.markdown);
        assert!(fitted.truncated);
    }

    #[test]
    fn details_are_dropped_before_the_episode() {
        let fitted = fit(&[], &[episode(10, 200)], 120);
        assert_eq!(fitted.episodes, vec![(0, 1)]);
        assert!(fitted.truncated);
    }

    #[test]
    fn counting_a_line_at_a_time_is_counting_the_whole() {
        let markdown = "## Semantic Memory\n- [preference] Nate loves coconut milk (said 3 May 2026; sources: 1 conversation)\n\n## Episodic Memories\n\n### Dairy-free desserts — 3 May 2026 (7 months ago)\n- Nate: \"I love coconut milk, but I also enjoy chocolate and mixed berry flavors.\"\n- Joanna: \"Ooh!\"\n\n### 里斯本 [rank: 2, score: 0.412, key moment]\n**When:** yesterday\n**Summary:** 我们下周五飞里斯本。\n\n**Details:**\n- user: \"Ship it by Friday!!!\n\"\n";
        let awkward = [
            markdown,
            "",
            "\n",
            "\n\n\n",
            "a line\n/then a slash\n  indented\n\tand a tab\n\n\nthree breaks before\n",
            "ends in punctuation?!\n\n- next\n).\n/path/to\n",
            "no break at the end",
            "trailing spaces   \nnext   \n   \n",
            "Ünïcödé line\n漢字が続く行\n12345678 digits\n'quoted'\n",
        ];
        let mut counter = LineTokens::new();
        for text in awkward {
            let lines: Vec<&str> = lines_counted_apart(text).collect();
            assert_eq!(lines.concat(), text, "cutting loses nothing");
            assert_eq!(counter.count(text), count_tokens(text), "{text:?}");
            // Again, from what it remembers.
            assert_eq!(counter.count(text), count_tokens(text), "{text:?}");
        }
        let long = format!(
            "{}\n{}\n",
            "的是我们在这个世界上".repeat(40),
            "word ".repeat(300)
        );
        assert_eq!(counter.count(&long), count_tokens(&long));
        for text in mixes(2_000) {
            assert_eq!(counter.count(&text), count_tokens(&text), "{text:?}");
        }
        // Another request's counter starts empty and finds these lines among the process's.
        let mut next_request = LineTokens::new();
        for text in awkward.iter().copied().chain([long.as_str()]) {
            assert_eq!(next_request.count(text), count_tokens(text), "{text:?}");
        }
        assert!(lines_counted_apart(awkward[0]).all(|line| COUNTED_LINES.get(line).is_some()));
    }

    /// `count` texts of sixteen pieces, each drawn from the characters the tokenizer's pattern
    /// treats apart (letters of each case, digits, CJK, emoji, combining marks, ligatures, line
    /// breaks of both kinds, slashes, punctuation, spaces and tabs), in every mix.
    fn mixes(count: usize) -> impl Iterator<Item = String> {
        const PIECES: [&str; 24] = [
            "a", "Bc", " ", "\n", "\r\n", "/", "!", ".", "的", "12", "\t", "'s", "'S", "-", "\"",
            "é", "e\u{301}", "😀", "ß", "ﬁ", "\u{200b}", "ǅ", "123456", "  ",
        ];
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..count).map(move |_| {
            (0..16)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    PIECES[(state >> 33) as usize % PIECES.len()]
                })
                .collect()
        })
    }

    #[test]
    fn counts_real_tokens() {
        assert_eq!(count_tokens("hello world"), 2);
        assert!(count_tokens("我喜欢深色模式") >= 3);
    }

    /// OpenAI's tokenizer, as tiktoken-rs ports it: the counts the budget promises.
    fn reference_count(text: &str) -> usize {
        static REFERENCE: std::sync::LazyLock<tiktoken_rs::CoreBPE> =
            std::sync::LazyLock::new(|| {
                tiktoken_rs::o200k_base().expect("o200k ships with tiktoken-rs")
            });
        REFERENCE.encode_ordinary(text).len()
    }

    #[test]
    fn counts_as_openais_tokenizer_does() {
        let prose = "Nate: I love coconut milk, but I also enjoy chocolate and mixed berry \
                    flavors.\n\n我喜欢深色模式，也喜欢喝绿茶。 Café naïve e\u{301} 😀 ﬁ ß 12345 'S\r\n"
            .repeat(20);
        assert_eq!(count_tokens(&prose), reference_count(&prose));
        let unspaced = "的是我们在这个世界上有很多不同的人".repeat(100);
        assert_eq!(count_tokens(&unspaced), reference_count(&unspaced));
        for text in mixes(5_000) {
            assert_eq!(count_tokens(&text), reference_count(&text), "{text:?}");
        }
    }
}
