//! The lines of a conversation that answer a query: what the Markdown shows of an episode, so
//! that an assistant reads the line that holds the answer, not only a summary of the segment
//! around it (issue 38).
//!
//! Lines are scored by Okapi BM25 over their stemmed content words (English Snowball; CJK
//! bigrams as they are), the collection being every line of the episodes offered together, so a
//! word common to all of them counts little. Each line counts a word once.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use super::bm25;
use super::ranking::is_question;

/// BM25's term saturation and length normalisation (the values the sparse leg uses).
const K1: f64 = 1.2;
const B: f64 = 0.75;
/// A chosen line with fewer words than this is shown with the line said before it, which it
/// usually answers ("Yes, last week!"); a chosen question is shown with the line after it.
const SHORT_LINE_WORDS: usize = 8;

static STEMMER: LazyLock<rust_stemmers::Stemmer> =
    LazyLock::new(|| rust_stemmers::Stemmer::create(rust_stemmers::Algorithm::English));

/// The stemmed content words of a text, each once.
fn stems(text: &str) -> HashSet<String> {
    crate::episode::content_terms(text)
        .into_iter()
        .map(|term| STEMMER.stem(&term).into_owned())
        .collect()
}

/// For each episode (the texts of its lines, in order), the lines that answer `query`, in the
/// order they were said: the `per_episode` best scoring above zero, each short one with the line
/// before it and each question with the line after it. An episode whose lines share no word with
/// the query gets none.
pub fn answering_lines(query: &str, episodes: &[Vec<&str>], per_episode: usize) -> Vec<Vec<usize>> {
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
        let chosen = answering_lines(
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
    fn a_short_answer_comes_with_the_line_it_answers() {
        let lines = vec![
            "Maria: Did you ever make it to Lisbon?",
            "Ana: Yes, last week, for the offsite!",
            "Maria: Great.",
        ];
        let chosen = answering_lines("when was the offsite", &[lines], 1);
        assert_eq!(chosen[0], vec![0, 1]);
    }

    #[test]
    fn a_question_comes_with_its_answer() {
        let lines = vec![
            "user: When do we leave for the Lisbon offsite?",
            "assistant: We fly out next Friday; the team meets at the airport at 7.",
        ];
        let chosen = answering_lines("when is the Lisbon offsite?", &[lines], 1);
        assert_eq!(chosen[0], vec![0, 1]);
    }

    #[test]
    fn no_shared_word_no_line() {
        let lines = vec!["Ana: Good morning!", "Maria: Morning!"];
        assert_eq!(
            answering_lines("the quarterly budget", &[lines], 3),
            vec![Vec::<usize>::new()]
        );
        assert!(answering_lines("anything", &[], 3).is_empty());
    }
}
