//! Pieces the retrieval quality evaluations of `make eval` share (`eval` over the memory tasks,
//! `eval-dialogs` over the multi-session dialogs): the evaluation user, the wait for the ingest
//! backfill, merging a response's two sections into one ranked list, nDCG, writing the report.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use engram_proto::v1;
use engram_proto::v1::retrieval_service_client::RetrievalServiceClient;
use tonic::transport::Channel;

/// The user every evaluation space belongs to.
pub const EVAL_USER: &str = "0e5a1e00-0000-4000-8000-000000000001";

/// The evaluation user's space `space`.
pub fn eval_scope(space: impl Into<String>) -> v1::Scope {
    v1::Scope {
        user_id: EVAL_USER.into(),
        space: space.into(),
    }
}

/// Every memory of a space (without embeddings), through ExportSpace.
pub async fn export_space(
    retrieval: &mut RetrievalServiceClient<Channel>,
    scope: &v1::Scope,
) -> anyhow::Result<Vec<v1::Memory>> {
    let mut stream = retrieval
        .export_space(v1::ExportSpaceRequest {
            scope: Some(scope.clone()),
            include_embeddings: false,
            page_size: 1000,
        })
        .await?
        .into_inner();
    let mut memories = Vec::new();
    while let Some(page) = stream.message().await? {
        memories.extend(page.memories.into_iter().filter_map(|m| m.memory));
    }
    Ok(memories)
}

/// Waits until the ingest backfill has embedded every entry of each space; a space given with
/// an expected count must also hold that many entries.
pub async fn wait_for_embeddings(
    retrieval: &mut RetrievalServiceClient<Channel>,
    spaces: &[(v1::Scope, Option<usize>)],
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    for (scope, expected) in spaces {
        loop {
            let memories = export_space(retrieval, scope).await?;
            let total = memories.len();
            let embedded = memories.iter().filter(|m| !m.needs_embedding).count();
            if expected.is_none_or(|expected| total == expected) && embedded == total {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "space {}: {embedded} of {total} entries embedded after {} s; is the ingest backfill running?",
                    scope.space,
                    timeout.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

/// Writes a report, creating its folder.
pub fn write_report(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("report written to {}", path.display());
    Ok(())
}

/// Merges two ranked lists, each kept in its own order, taking the higher-scored head each time:
/// one ranked list from a response's facts and episodes.
pub fn merge_by_heads<K>(first: Vec<(f64, K)>, second: Vec<(f64, K)>) -> Vec<K> {
    let mut merged = Vec::with_capacity(first.len() + second.len());
    let (mut a, mut b) = (first.into_iter().peekable(), second.into_iter().peekable());
    loop {
        let take_first = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => x.0 >= y.0,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_first { a.next() } else { b.next() };
        merged.extend(next.map(|(_, key)| key));
    }
    merged
}

/// nDCG@k of a ranked list of keys against graded judgements (gain 2^grade − 1; unjudged keys
/// gain nothing); 0 when nothing is relevant.
pub fn ndcg_at(ranked: &[String], relevant: &BTreeMap<String, u32>, k: usize) -> f64 {
    let gain = |grade: u32| f64::from((1u32 << grade) - 1);
    let dcg = |grades: &mut dyn Iterator<Item = u32>| -> f64 {
        grades
            .take(k)
            .enumerate()
            .map(|(position, grade)| gain(grade) / ((position + 2) as f64).log2())
            .sum()
    };
    let mut ideal: Vec<u32> = relevant.values().copied().collect();
    ideal.sort_unstable_by(|a, b| b.cmp(a));
    let actual = dcg(&mut ranked
        .iter()
        .map(|key| relevant.get(key).copied().unwrap_or(0)));
    let best = dcg(&mut ideal.into_iter());
    if best > 0.0 { actual / best } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn merging_keeps_each_sections_order() {
        let facts = vec![(0.9, "f1".to_owned()), (0.2, "f2".to_owned())];
        let episodes = vec![(0.5, "e1".to_owned()), (0.6, "e2".to_owned())];
        assert_eq!(merge_by_heads(facts, episodes), ["f1", "e1", "e2", "f2"]);
    }

    #[test]
    fn ndcg_is_one_for_the_ideal_order_and_zero_without_a_hit() {
        let relevant = BTreeMap::from([("a".to_owned(), 2), ("b".to_owned(), 1)]);
        assert!((ndcg_at(&keys(&["a", "b", "c"]), &relevant, 10) - 1.0).abs() < 1e-9);
        assert_eq!(ndcg_at(&keys(&["c", "d"]), &relevant, 10), 0.0);
        let swapped = ndcg_at(&keys(&["b", "a"]), &relevant, 5);
        assert!(swapped < 1.0 && swapped > 0.5, "{swapped}");
    }

    #[test]
    fn ndcg_counts_only_the_first_k() {
        let relevant = BTreeMap::from([("a".to_owned(), 1)]);
        assert_eq!(ndcg_at(&keys(&["x", "y", "a"]), &relevant, 2), 0.0);
        assert!(ndcg_at(&keys(&["x", "y", "a"]), &relevant, 3) > 0.0);
    }
}
