//! The token budget of a retrieval's Markdown, counted with a real BPE tokenizer (o200k_base, the
//! encoding of current OpenAI models; other LLMs' tokenizers land within a few percent of it).
//!
//! Parts are taken in priority order — the best episode, the best fact, the second episode, the
//! second fact, … — so that neither section can starve the other. An episode is tried in each of
//! its renderings, the fullest first (its excerpt, the lines that answer the query, its summary);
//! a part that does not fit at all is left out. Either way the response is marked truncated. The assembled Markdown is counted once more at the end, and parts are dropped
//! from the back should joining them have cost more than their separate counts.

use std::sync::LazyLock;

use tiktoken_rs::CoreBPE;

use super::markdown::{EPISODIC_HEADING, SEMANTIC_HEADING, assemble};

static TOKENIZER: LazyLock<CoreBPE> = LazyLock::new(|| {
    tiktoken_rs::o200k_base().expect("the o200k_base vocabulary ships with tiktoken-rs")
});

/// Default budget of a retrieval's Markdown.
pub const DEFAULT_TOKEN_BUDGET: u32 = 2_000;

/// Loads the token counter's vocabulary now (a few hundred milliseconds of one core). Services
/// call it at start, on a blocking thread, before they report ready: otherwise the first request
/// that counts tokens loads it on the async runtime while every other request waits (the first
/// appends of the conversations benchmark waited up to 250 ms).
pub fn load_tokenizer() {
    LazyLock::force(&TOKENIZER);
}

/// The longest run of characters of one kind (whitespace, or not) that is counted in one go.
///
/// The tokenizer cuts text into pieces at spaces and punctuation, then merges each piece's bytes
/// in time that grows with the square of the piece's length; a text without spaces (Chinese,
/// Japanese, a long token or URL) is one piece: 8,192 unspaced CJK characters took 250 ms, and a
/// request of a hundred of them stalled a service (issue 37). A longer run is counted in parts of
/// this many characters, so the cost stays linear in the text; each cut changes the count by a
/// token or so, in texts that ordinary prose never produces (ordinary text is one part and is
/// counted exactly).
const LONGEST_RUN_COUNTED_WHOLE: usize = 128;

/// Tokens of a text: exact for ordinary text, within a token or so per cut for runs longer than
/// [`LONGEST_RUN_COUNTED_WHOLE`] characters.
pub fn count_tokens(text: &str) -> usize {
    parts_of_bounded_runs(text)
        .into_iter()
        .map(|part| TOKENIZER.encode_ordinary(part).len())
        .sum()
}

/// `text` cut inside every run of more than [`LONGEST_RUN_COUNTED_WHOLE`] characters of one kind
/// (whitespace or not), and nowhere else.
fn parts_of_bounded_runs(text: &str) -> Vec<&str> {
    let mut cuts = Vec::new();
    let mut run = 0usize;
    let mut run_is_whitespace = None;
    for (at, character) in text.char_indices() {
        let whitespace = character.is_whitespace();
        if run_is_whitespace == Some(whitespace) {
            run += 1;
        } else {
            run = 1;
            run_is_whitespace = Some(whitespace);
        }
        if run > LONGEST_RUN_COUNTED_WHOLE {
            cuts.push(at);
            run = 1;
        }
    }
    let starts = std::iter::once(0).chain(cuts.iter().copied());
    let ends = cuts.iter().copied().chain(std::iter::once(text.len()));
    starts
        .zip(ends)
        .map(|(start, end)| &text[start..end])
        .collect()
}

/// The renderings of an episode, the fullest first (its excerpt, the lines that answer the query,
/// its summary): the budget takes the first that fits. At least one.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodePart {
    pub renderings: Vec<String>,
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

/// Fits facts (best first) and episodes (best first) into `budget` tokens.
pub fn fit(facts: &[String], episodes: &[EpisodePart], budget: usize) -> Fitted {
    let mut order = Vec::with_capacity(facts.len() + episodes.len());
    for position in 0..facts.len().max(episodes.len()) {
        if position < episodes.len() {
            order.push(Part::Episode(position));
        }
        if position < facts.len() {
            order.push(Part::Fact(position));
        }
    }
    // Headings and the blank lines between parts, paid once a section is present.
    let semantic_overhead = count_tokens(SEMANTIC_HEADING);
    let episodic_overhead = count_tokens(EPISODIC_HEADING) + 2;

    let mut used = 0usize;
    let mut truncated = false;
    let mut taken_facts: Vec<usize> = Vec::new();
    let mut taken_episodes: Vec<(usize, usize)> = Vec::new();
    // Order in which parts were taken, to drop from the back if the final count is over.
    let mut taken_order: Vec<Part> = Vec::new();
    for part in order {
        match part {
            Part::Fact(index) => {
                let overhead = if taken_facts.is_empty() {
                    semantic_overhead
                } else {
                    0
                };
                let cost = overhead + count_tokens(&facts[index]);
                if used + cost <= budget {
                    used += cost;
                    taken_facts.push(index);
                    taken_order.push(part);
                } else {
                    truncated = true;
                }
            }
            Part::Episode(index) => {
                let overhead = if taken_episodes.is_empty() {
                    episodic_overhead
                } else {
                    1
                };
                for (rendering, text) in episodes[index].renderings.iter().enumerate() {
                    let cost = overhead + count_tokens(text);
                    if used + cost <= budget {
                        used += cost;
                        taken_episodes.push((index, rendering));
                        taken_order.push(part);
                        break;
                    }
                    truncated = true;
                }
            }
        }
    }

    loop {
        taken_facts.sort_unstable();
        taken_episodes.sort_unstable();
        let fact_lines: Vec<String> = taken_facts.iter().map(|&i| facts[i].clone()).collect();
        let blocks: Vec<String> = taken_episodes
            .iter()
            .map(|&(i, rendering)| episodes[i].renderings[rendering].clone())
            .collect();
        let markdown = assemble(&fact_lines, &blocks);
        let tokens = count_tokens(&markdown);
        if tokens <= budget || taken_order.is_empty() {
            return Fitted {
                facts: taken_facts,
                episodes: taken_episodes,
                markdown,
                tokens,
                truncated,
            };
        }
        truncated = true;
        match taken_order.pop() {
            Some(Part::Fact(index)) => taken_facts.retain(|&i| i != index),
            Some(Part::Episode(index)) => taken_episodes.retain(|&(i, _)| i != index),
            None => unreachable!("checked above"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("- [fact] The user mentioned item number {i} in a conversation (sources: 1 conversation)\n"))
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
    fn details_are_dropped_before_the_episode() {
        let fitted = fit(&[], &[episode(10, 200)], 120);
        assert_eq!(fitted.episodes, vec![(0, 1)]);
        assert!(fitted.truncated);
    }

    #[test]
    fn counts_real_tokens() {
        assert_eq!(count_tokens("hello world"), 2);
        assert!(count_tokens("我喜欢深色模式") >= 3);
    }

    #[test]
    fn ordinary_text_is_counted_whole_and_exactly() {
        let text = "Nate: I love coconut milk, but I also enjoy chocolate and mixed berry \
                    flavors.\n\n我喜欢深色模式，也喜欢喝绿茶。 "
            .repeat(50);
        assert_eq!(parts_of_bounded_runs(&text).len(), 1);
        assert_eq!(count_tokens(&text), TOKENIZER.encode_ordinary(&text).len());
    }

    #[test]
    fn long_runs_are_cut_and_counted_close_to_whole() {
        let unspaced = "的是我们在这个世界上有很多不同的人".repeat(500);
        let parts = parts_of_bounded_runs(&unspaced);
        assert!(parts.len() > 1);
        assert_eq!(parts.concat(), unspaced, "cutting loses nothing");
        assert!(
            parts
                .iter()
                .all(|part| part.chars().count() <= LONGEST_RUN_COUNTED_WHOLE)
        );
        let whole = TOKENIZER.encode_ordinary(&unspaced).len();
        let counted = count_tokens(&unspaced);
        // At most one token more or less per cut.
        assert!(
            counted.abs_diff(whole) <= parts.len(),
            "counted {counted}, whole {whole}, {} parts",
            parts.len()
        );
        let spaces = format!("a{}b", " ".repeat(1_000));
        assert!(parts_of_bounded_runs(&spaces).len() > 1);
        assert_eq!(parts_of_bounded_runs(""), vec![""]);
    }
}
