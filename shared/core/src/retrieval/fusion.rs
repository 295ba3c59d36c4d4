//! Reciprocal rank fusion: each leg contributes 1 / (k + rank) for every entry it found, so a leg
//! that found nothing (the embedder is down, the query has no indexed word) simply contributes
//! nothing, and no score of one leg has to be made comparable with the other's.

use std::collections::HashMap;

use uuid::Uuid;

/// RRF's constant of the original paper (Cormack et al., 2009).
pub const DEFAULT_RRF_K: f64 = 60.0;

/// Where one leg ranked an entry (1-based) and the leg's own score for it (BM25 or trigram
/// similarity for the sparse leg, cosine similarity for the dense leg).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LegHit {
    pub rank: u32,
    pub score: f64,
}

/// One entry after fusion.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused {
    pub id: Uuid,
    pub sparse: Option<LegHit>,
    pub dense: Option<LegHit>,
    pub rrf: f64,
}

/// Fuses two ranked lists (best first, each entry once) into one, best first; ties keep the
/// order of the ids so that results are reproducible.
pub fn fuse(sparse: &[(Uuid, f64)], dense: &[(Uuid, f64)], k: f64) -> Vec<Fused> {
    let mut fused: HashMap<Uuid, Fused> = HashMap::with_capacity(sparse.len() + dense.len());
    let mut add = |list: &[(Uuid, f64)], is_sparse: bool| {
        for (position, (id, score)) in list.iter().enumerate() {
            let rank = position as u32 + 1;
            let entry = fused.entry(*id).or_insert(Fused {
                id: *id,
                sparse: None,
                dense: None,
                rrf: 0.0,
            });
            let hit = Some(LegHit {
                rank,
                score: *score,
            });
            let slot = if is_sparse {
                &mut entry.sparse
            } else {
                &mut entry.dense
            };
            if slot.is_none() {
                *slot = hit;
                entry.rrf += 1.0 / (k + f64::from(rank));
            }
        }
    };
    add(sparse, true);
    add(dense, false);
    let mut fused: Vec<Fused> = fused.into_values().collect();
    fused.sort_by(|a, b| b.rrf.total_cmp(&a.rrf).then(a.id.cmp(&b.id)));
    fused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn entries_found_by_both_legs_rank_first() {
        let sparse = [(id(1), 9.0), (id(2), 5.0), (id(3), 1.0)];
        let dense = [(id(3), 0.9), (id(4), 0.8)];
        let fused = fuse(&sparse, &dense, DEFAULT_RRF_K);
        assert_eq!(fused[0].id, id(3));
        assert!((fused[0].rrf - (1.0 / 63.0 + 1.0 / 61.0)).abs() < 1e-12);
        assert_eq!(fused[0].sparse.unwrap().rank, 3);
        assert_eq!(fused[0].dense.unwrap().rank, 1);
        // Found by one leg each: first in sparse (1/61) beats second in dense (1/62).
        assert_eq!(fused[1].id, id(1));
        assert_eq!(fused.len(), 4);
    }

    #[test]
    fn an_empty_leg_leaves_the_other_in_order() {
        let sparse = [(id(7), 3.0), (id(5), 2.0)];
        let fused = fuse(&sparse, &[], DEFAULT_RRF_K);
        let ids: Vec<Uuid> = fused.iter().map(|f| f.id).collect();
        assert_eq!(ids, vec![id(7), id(5)]);
        assert!(fused.iter().all(|f| f.dense.is_none()));
    }
}
