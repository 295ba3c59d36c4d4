//! The lines of the stored conversations that answer a query: what the Markdown shows an
//! assistant, verbatim, so that it reads the line that holds the answer and not only a summary
//! of the segment around it (issue 38).
//!
//! The store finds the space's turns that share words with the query (Okapi BM25 over every
//! turn) and loads each with its neighbours; here each line gets its evidence — its own match,
//! weighed like a fact's (a question, another speaker's line and the days the query names count
//! as they do for facts), plus a share of its episode's ranking score — and a line next to one
//! that answers gets part of that line's evidence ("Yes, last week!" after "Did you go to
//! Lisbon?"). The best lines are shown, each short one with the line before it and each question
//! with the line after it.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use super::bm25;
use super::ranking::is_question;

/// A line's own evidence is raised by this share of its best adjacent line's.
pub const NEIGHBOUR_SHARE: f64 = 0.5;
/// A line scoring less than this share of the best line's score is left out, however few lines
/// were chosen: in a small space every turn is near the query by its vector, and without it the
/// lines of an unrelated session filled the budget beside the one that answers.
pub const LEAST_SHARE_OF_BEST: f64 = 0.3;
/// A chosen line with fewer words than this is shown with the line said before it, which it
/// usually answers ("Yes, last week!"); a chosen question is shown with the line after it.
const SHORT_LINE_WORDS: usize = 8;

/// A stored line offered to the choice. Lines come in conversation order: each conversation's
/// turns together, ascending.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OfferedLine<'a> {
    pub text: &'a str,
    /// How well the line itself answers (0 when the search did not find it).
    pub evidence: f64,
    /// The line before it in the slice is the turn said just before it in the same conversation.
    pub follows_previous: bool,
}

/// A line chosen for what it says, with the lines shown with it (itself included), in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ChosenLine {
    pub line: usize,
    pub score: f64,
    pub shown: Vec<usize>,
}

/// The `max_lines` lines of `lines` that answer best, best first: each line's evidence plus
/// [`NEIGHBOUR_SHARE`] of its best adjacent line's, above zero and at least
/// [`LEAST_SHARE_OF_BEST`] of the best line's.
pub fn choose_lines(lines: &[OfferedLine<'_>], max_lines: usize) -> Vec<ChosenLine> {
    let adjacent = |index: usize| {
        let before = (index > 0 && lines[index].follows_previous).then(|| index - 1);
        let after =
            (index + 1 < lines.len() && lines[index + 1].follows_previous).then_some(index + 1);
        before.into_iter().chain(after)
    };
    let mut scored: Vec<(usize, f64)> = lines
        .iter()
        .enumerate()
        // A line that is nothing but a greeting, thanks or an acknowledgement ("Thanks, bye!")
        // never answers: in a small space every line is near the query by its vector, and such
        // lines filled blocks. It may still be shown beside a line that answers.
        .filter(|(_, line)| !is_chit_chat_line(line.text))
        .map(|(index, line)| {
            let neighbours = adjacent(index)
                .map(|other| lines[other].evidence)
                .fold(0.0, f64::max);
            (index, line.evidence + NEIGHBOUR_SHARE * neighbours)
        })
        .filter(|(_, score)| *score > 0.0 && score.is_finite())
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let least = scored
        .first()
        .map_or(0.0, |best| best.1 * LEAST_SHARE_OF_BEST);
    scored
        .into_iter()
        .take(max_lines)
        .take_while(|(_, score)| *score >= least)
        .map(|(index, score)| {
            let mut shown = Vec::with_capacity(2);
            let question = is_question(lines[index].text);
            // A short answer with what it answers; a question with its answer (below).
            if !question
                && index > 0
                && lines[index].follows_previous
                && lines[index].text.split_whitespace().count() < SHORT_LINE_WORDS
            {
                shown.push(index - 1);
            }
            shown.push(index);
            if question && index + 1 < lines.len() && lines[index + 1].follows_previous {
                shown.push(index + 1);
            }
            ChosenLine {
                line: index,
                score,
                shown,
            }
        })
        .collect()
}

/// Whether a line, without the "Name: " it may open with, is only chit-chat.
fn is_chit_chat_line(text: &str) -> bool {
    let said = crate::speaker::split_speaker(text).map_or(text, |(_, said)| said);
    crate::importance::is_chit_chat(said)
}

/// BM25's term saturation and length normalisation (the values the sparse leg uses).
const K1: f64 = 1.2;
const B: f64 = 0.75;

static STEMMER: LazyLock<rust_stemmers::Stemmer> =
    LazyLock::new(|| rust_stemmers::Stemmer::create(rust_stemmers::Algorithm::English));

/// The stemmed content words of a text, each once.
fn stems(text: &str) -> HashSet<String> {
    crate::episode::content_terms(text)
        .into_iter()
        .map(|term| STEMMER.stem(&term).into_owned())
        .collect()
}

/// Where the turns are not stored (an imported episode carries its conversation excerpt only):
/// for each episode (the texts of its excerpt's lines, in order), the lines that answer `query`,
/// in the order they were said, by Okapi BM25 over their stemmed content words (English
/// Snowball; CJK bigrams as they are), the collection being every line of the episodes offered
/// together, each line counting a word once: the `per_episode` best scoring above zero, each short one with the line
/// before it and each question with the line after it. An episode whose lines share no word with
/// the query gets none.
pub fn lines_within_excerpts(
    query: &str,
    episodes: &[Vec<&str>],
    per_episode: usize,
) -> Vec<Vec<usize>> {
    let query_stems = stems(query);
    let line_stems: Vec<Vec<HashSet<String>>> = episodes
        .iter()
        .map(|lines| lines.iter().map(|line| stems(line)).collect())
        .collect();
    let documents = line_stems.iter().map(Vec::len).sum::<usize>().max(1) as f64;
    let average_length =
        line_stems.iter().flatten().map(HashSet::len).sum::<usize>() as f64 / documents;
    let mut document_frequency: HashMap<&str, f64> = HashMap::new();
    for line in line_stems.iter().flatten() {
        for stem in line.iter().filter(|stem| query_stems.contains(*stem)) {
            *document_frequency.entry(stem.as_str()).or_default() += 1.0;
        }
    }
    let score = |line: &HashSet<String>| -> f64 {
        let length = line.len() as f64 / average_length.max(1.0);
        line.iter()
            .filter_map(|stem| document_frequency.get(stem.as_str()))
            .map(|&df| bm25::idf(documents, df) * (K1 + 1.0) / (1.0 + K1 * (1.0 - B + B * length)))
            .sum()
    };
    episodes
        .iter()
        .zip(&line_stems)
        .map(|(lines, stems_of_lines)| {
            let mut scored: Vec<(usize, f64)> = stems_of_lines
                .iter()
                .enumerate()
                .map(|(index, line)| (index, score(line)))
                .filter(|(_, score)| *score > 0.0)
                .collect();
            scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut chosen: Vec<usize> = Vec::new();
            for (index, _) in scored.into_iter().take(per_episode) {
                if index > 0 && lines[index].split_whitespace().count() < SHORT_LINE_WORDS {
                    chosen.push(index - 1);
                }
                chosen.push(index);
                // A question is shown with the line that answers it.
                if is_question(lines[index]) && index + 1 < lines.len() {
                    chosen.push(index + 1);
                }
            }
            chosen.sort_unstable();
            chosen.dedup();
            chosen
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered<'a>(lines: &[(&'a str, f64)]) -> Vec<OfferedLine<'a>> {
        lines
            .iter()
            .enumerate()
            .map(|(index, &(text, evidence))| OfferedLine {
                text,
                evidence,
                follows_previous: index > 0,
            })
            .collect()
    }

    #[test]
    fn a_greeting_or_thanks_is_never_chosen_for_itself() {
        let lines = offered(&[
            ("Clara: Thanks, bye!", 0.9),
            ("Good morning!", 0.8),
            (
                "Jonas: Much better, I did 16 km on Sunday without pain.",
                0.5,
            ),
        ]);
        let chosen: Vec<usize> = choose_lines(&lines, 10)
            .iter()
            .map(|line| line.line)
            .collect();
        assert_eq!(chosen, vec![2]);
    }

    #[test]
    fn the_best_lines_come_first_and_lines_without_evidence_are_left_out() {
        let lines = offered(&[
            (
                "Joanna: Hey Nate, I have not heard from you in a while.",
                0.0,
            ),
            (
                "Nate: I love coconut milk, but I also enjoy chocolate and mixed berry flavors.",
                0.9,
            ),
            (
                "Joanna: That sounds delicious, I should really try it!",
                0.0,
            ),
            (
                "Nate: The tournament starts on Friday, wish me luck there.",
                0.2,
            ),
        ]);
        let chosen = choose_lines(&lines, 2);
        assert_eq!(chosen.len(), 2);
        assert_eq!(chosen[0].line, 1);
        assert_eq!(chosen[0].shown, vec![1]);
        // The lines beside the evidence line get half its evidence, above the weak match (the
        // earlier of the two first).
        assert_eq!(chosen[1].line, 0);
        assert!((chosen[1].score - 0.45).abs() < 1e-9);
    }

    #[test]
    fn lines_far_below_the_best_are_left_out() {
        let mut lines = offered(&[
            (
                "Maria: The offsite is in Lisbon, we fly out next Friday.",
                1.0,
            ),
            ("Ana: I bought new running shoes for the marathon.", 0.1),
        ]);
        lines[1].follows_previous = false;
        let chosen = choose_lines(&lines, 5);
        assert_eq!(chosen.len(), 1, "{chosen:?}");
        assert_eq!(chosen[0].line, 0);
    }

    #[test]
    fn a_short_answer_comes_with_the_line_it_answers() {
        let lines = offered(&[
            (
                "Maria: Did you ever make it to Lisbon for the offsite?",
                0.0,
            ),
            ("Ana: Yes, last week!", 0.8),
        ]);
        assert_eq!(choose_lines(&lines, 1)[0].shown, vec![0, 1]);
    }

    #[test]
    fn a_question_comes_with_its_answer() {
        let lines = offered(&[
            ("user: When do we leave for the Lisbon offsite?", 1.0),
            (
                "assistant: We fly out next Friday; the team meets at the airport at 7.",
                0.0,
            ),
        ]);
        assert_eq!(choose_lines(&lines, 1)[0].shown, vec![0, 1]);
    }

    #[test]
    fn neighbours_are_only_the_same_conversations_adjacent_turns() {
        let mut lines = offered(&[("Ana: ok", 0.0), ("Maria: The offsite is in Lisbon.", 1.0)]);
        // Another conversation's turn, or a turn further on: not a neighbour.
        lines[1].follows_previous = false;
        let chosen = choose_lines(&lines, 5);
        assert_eq!(chosen.len(), 1);
        assert_eq!(chosen[0].shown, vec![1]);
    }

    #[test]
    fn nothing_offered_nothing_chosen() {
        assert!(choose_lines(&[], 5).is_empty());
        assert!(choose_lines(&offered(&[("Ana: Good morning!", 0.0)]), 5).is_empty());
    }

    #[test]
    fn the_line_that_answers_is_chosen_by_its_words_stemmed() {
        let dessert = vec![
            "Joanna: Hey Nate! How was your week?",
            "Nate: Busy, but I tried a new recipe.",
            "Nate: I love coconut milk, but I also enjoy chocolate and mixed berry flavors.",
            "Joanna: That sounds delicious!",
        ];
        let work = vec![
            "Nate: The tournament starts on Friday.",
            "Joanna: Good luck with the tournament!",
        ];
        let chosen = lines_within_excerpts(
            "Which dairy-free dessert flavors does Nate enjoy?",
            &[dessert, work],
            1,
        );
        assert_eq!(
            chosen[0],
            vec![2],
            "flavors ~ flavor, enjoy: the evidence line"
        );
        // Only "Nate" matches there, in the one line that names him first.
        assert!(chosen[1].len() <= 1);
    }

    #[test]
    fn within_excerpts_a_short_answer_comes_with_the_line_it_answers() {
        let lines = vec![
            "Maria: Did you ever make it to Lisbon?",
            "Ana: Yes, last week, for the offsite!",
            "Maria: Great.",
        ];
        let chosen = lines_within_excerpts("when was the offsite", &[lines], 1);
        assert_eq!(chosen[0], vec![0, 1]);
    }

    #[test]
    fn within_excerpts_a_question_comes_with_its_answer() {
        let lines = vec![
            "user: When do we leave for the Lisbon offsite?",
            "assistant: We fly out next Friday; the team meets at the airport at 7.",
        ];
        let chosen = lines_within_excerpts("when is the Lisbon offsite?", &[lines], 1);
        assert_eq!(chosen[0], vec![0, 1]);
    }

    #[test]
    fn no_shared_word_no_line() {
        let lines = vec!["Ana: Good morning!", "Maria: Morning!"];
        assert_eq!(
            lines_within_excerpts("the quarterly budget", &[lines], 3),
            vec![Vec::<usize>::new()]
        );
        assert!(lines_within_excerpts("anything", &[], 3).is_empty());
    }
}
