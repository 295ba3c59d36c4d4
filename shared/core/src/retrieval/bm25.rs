//! Okapi BM25, written out plainly. Postgres computes the scores retrieval uses (from the
//! `search_document` tsvector of each entry); this reference states the formula once, and tests
//! hold the SQL to it.
//!
//! score(D, Q) = Σ_{t ∈ Q} IDF(t) · tf(t, D) · (k1 + 1) / (tf(t, D) + k1 · (1 − b + b · |D| / avgdl))
//! IDF(t) = ln(1 + (N − df(t) + 0.5) / (df(t) + 0.5))
//!
//! This is the IDF of Lucene's BM25: always positive, so a word found in most entries still
//! counts a little instead of subtracting. Each distinct query word counts once. N, df and avgdl
//! are taken over the collection searched (one space's active entries of one kind).

use std::collections::{HashMap, HashSet};

/// Term-frequency saturation.
pub const K1: f64 = 1.2;
/// Length normalisation.
pub const B: f64 = 0.75;

/// IDF of a word found in `document_frequency` of `documents` entries.
pub fn idf(documents: f64, document_frequency: f64) -> f64 {
    (1.0 + (documents - document_frequency + 0.5) / (document_frequency + 0.5)).ln()
}

/// BM25 of every document for the query; documents are already tokenized. Documents without any
/// query word score 0.
pub fn reference_scores(documents: &[Vec<String>], query: &[String]) -> Vec<f64> {
    let count = documents.len() as f64;
    if documents.is_empty() {
        return Vec::new();
    }
    let average_length = documents.iter().map(Vec::len).sum::<usize>() as f64 / count;
    let query_words: HashSet<&String> = query.iter().collect();
    let mut document_frequency: HashMap<&String, f64> = HashMap::new();
    for document in documents {
        let distinct: HashSet<&String> = document.iter().collect();
        for word in &query_words {
            if distinct.contains(word) {
                *document_frequency.entry(word).or_default() += 1.0;
            }
        }
    }
    documents
        .iter()
        .map(|document| {
            let length = document.len() as f64;
            query_words
                .iter()
                .map(|word| {
                    let frequency = document.iter().filter(|token| token == word).count() as f64;
                    if frequency == 0.0 {
                        return 0.0;
                    }
                    let df = document_frequency[word];
                    idf(count, df) * frequency * (K1 + 1.0)
                        / (frequency + K1 * (1.0 - B + B * length / average_length))
                })
                .sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn rarer_words_and_shorter_documents_score_higher() {
        let documents = [
            tokens("the cat sat on the mat"),
            tokens("the dog chased the cat around the big garden"),
            tokens("rust is fast"),
        ];
        let scores = reference_scores(&documents, &tokens("cat mat"));
        assert!(scores[0] > scores[1], "{scores:?}");
        assert_eq!(scores[2], 0.0);
        // Hand-computed: N = 3, avgdl = 6, cat in 2 documents, mat in 1.
        let idf_cat = (1.0f64 + 1.5 / 2.5).ln();
        let idf_mat = (1.0f64 + 2.5 / 1.5).ln();
        let expected = idf_cat * 2.2 / (1.0 + 1.2) + idf_mat * 2.2 / (1.0 + 1.2);
        assert!((scores[0] - expected).abs() < 1e-12);
    }

    #[test]
    fn repeated_query_words_count_once() {
        let documents = [tokens("a b"), tokens("b c")];
        assert_eq!(
            reference_scores(&documents, &tokens("a a a")),
            reference_scores(&documents, &tokens("a"))
        );
    }
}
