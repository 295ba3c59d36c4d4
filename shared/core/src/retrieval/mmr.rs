//! Maximal marginal relevance: picks entries one at a time, each maximising
//! λ · value − (1 − λ) · (its highest similarity to an entry already picked), so that the context
//! does not spend its budget on five phrasings of the same thing.
//!
//! Similarity is the cosine of the two embeddings; when either entry has none, the overlap of
//! their tags (Jaccard). When two entries tie, the one sharing fewer tags with those already
//! picked wins, then the higher value.

use std::collections::HashSet;

/// A candidate as MMR sees it.
#[derive(Debug, Clone)]
pub struct MmrItem<'a> {
    /// The ranking score, normalised to [0, 1] over the candidates.
    pub value: f64,
    pub embedding: Option<&'a [f32]>,
    pub tags: &'a [String],
}

const TIE: f64 = 1e-9;

/// Similarity of two candidates in [0, 1].
pub fn similarity(a: &MmrItem<'_>, b: &MmrItem<'_>) -> f64 {
    match (a.embedding, b.embedding) {
        (Some(x), Some(y)) => f64::from(cosine(x, y)).clamp(0.0, 1.0),
        _ => tag_overlap(a.tags, b.tags),
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    cosine_with_norms(a, norm(a), b, norm(b))
}

fn norm(vector: &[f32]) -> f32 {
    vector.iter().map(|x| x * x).sum::<f32>().sqrt()
}

fn cosine_with_norms(a: &[f32], norm_a: f32, b: &[f32], norm_b: f32) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norms = norm_a * norm_b;
    if norms == 0.0 { 0.0 } else { dot / norms }
}

/// Jaccard overlap of two tag sets (0 when both are empty).
pub fn tag_overlap(a: &[String], b: &[String]) -> f64 {
    let a: HashSet<&String> = a.iter().collect();
    let b: HashSet<&String> = b.iter().collect();
    let union = a.union(&b).count();
    if union == 0 {
        0.0
    } else {
        a.intersection(&b).count() as f64 / union as f64
    }
}

fn shared_tags(item: &MmrItem<'_>, picked: &[&MmrItem<'_>]) -> usize {
    let tags: HashSet<&String> = item.tags.iter().collect();
    picked
        .iter()
        .map(|other| other.tags.iter().filter(|tag| tags.contains(tag)).count())
        .sum()
}

/// Indexes of up to `limit` items in the order MMR picks them.
pub fn select(items: &[MmrItem<'_>], lambda: f64, limit: usize) -> Vec<usize> {
    let lambda = lambda.clamp(0.0, 1.0);
    let mut picked: Vec<usize> = Vec::with_capacity(limit.min(items.len()));
    // Highest similarity of each remaining item to anything picked so far.
    let mut max_similarity = vec![0.0f64; items.len()];
    let mut remaining: Vec<usize> = (0..items.len()).collect();
    // Norms once per item, not once per pair: the pairwise loop below is MMR's whole cost.
    let norms: Vec<f32> = items
        .iter()
        .map(|item| item.embedding.map_or(0.0, norm))
        .collect();
    let similarity_of = |a: usize, b: usize| -> f64 {
        match (items[a].embedding, items[b].embedding) {
            (Some(x), Some(y)) => {
                f64::from(cosine_with_norms(x, norms[a], y, norms[b])).clamp(0.0, 1.0)
            }
            _ => tag_overlap(items[a].tags, items[b].tags),
        }
    };
    while picked.len() < limit && !remaining.is_empty() {
        let picked_items: Vec<&MmrItem<'_>> = picked.iter().map(|&i| &items[i]).collect();
        let mut best_position = 0;
        let mut best: Option<(f64, usize, f64)> = None;
        for (position, &index) in remaining.iter().enumerate() {
            let item = &items[index];
            let marginal = lambda * item.value - (1.0 - lambda) * max_similarity[index];
            let better = match best {
                None => true,
                Some((best_marginal, best_shared, best_value)) => {
                    if marginal > best_marginal + TIE {
                        true
                    } else if marginal < best_marginal - TIE {
                        false
                    } else {
                        let shared = shared_tags(item, &picked_items);
                        shared < best_shared || (shared == best_shared && item.value > best_value)
                    }
                }
            };
            if better {
                best = Some((marginal, shared_tags(item, &picked_items), item.value));
                best_position = position;
            }
        }
        let chosen = remaining.remove(best_position);
        for &index in &remaining {
            let s = similarity_of(index, chosen);
            if s > max_similarity[index] {
                max_similarity[index] = s;
            }
        }
        picked.push(chosen);
    }
    picked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_near_copy_of_the_top_entry_yields_to_a_different_one() {
        let e1 = [1.0f32, 0.0, 0.0];
        let e2 = [0.99f32, 0.14, 0.0];
        let e3 = [0.0f32, 0.0, 1.0];
        let none: Vec<String> = Vec::new();
        let items = [
            MmrItem {
                value: 1.0,
                embedding: Some(&e1),
                tags: &none,
            },
            MmrItem {
                value: 0.95,
                embedding: Some(&e2),
                tags: &none,
            },
            MmrItem {
                value: 0.8,
                embedding: Some(&e3),
                tags: &none,
            },
        ];
        assert_eq!(select(&items, 0.7, 3), vec![0, 2, 1]);
        // λ = 1 is ranking by value alone.
        assert_eq!(select(&items, 1.0, 3), vec![0, 1, 2]);
    }

    #[test]
    fn without_embeddings_tag_overlap_is_the_similarity_and_breaks_ties() {
        let a = tags(&["rust", "work"]);
        let b = tags(&["rust", "work"]);
        let c = tags(&["family"]);
        let items = [
            MmrItem {
                value: 1.0,
                embedding: None,
                tags: &a,
            },
            MmrItem {
                value: 0.9,
                embedding: None,
                tags: &b,
            },
            MmrItem {
                value: 0.9,
                embedding: None,
                tags: &c,
            },
        ];
        assert_eq!(select(&items, 0.5, 2), vec![0, 2]);
        // Equal marginal scores (λ = 1): the entry sharing no tag with the picked one wins.
        let items = [
            MmrItem {
                value: 1.0,
                embedding: None,
                tags: &a,
            },
            MmrItem {
                value: 0.9,
                embedding: None,
                tags: &b,
            },
            MmrItem {
                value: 0.9,
                embedding: None,
                tags: &c,
            },
        ];
        assert_eq!(select(&items, 1.0, 2), vec![0, 2]);
    }

    #[test]
    fn never_returns_more_than_asked_or_than_there_are() {
        let none: Vec<String> = Vec::new();
        let items = vec![
            MmrItem {
                value: 0.5,
                embedding: None,
                tags: &none
            };
            3
        ];
        assert_eq!(select(&items, 0.7, 10).len(), 3);
        assert_eq!(select(&items, 0.7, 2).len(), 2);
        assert!(select(&[], 0.7, 2).is_empty());
    }
}
