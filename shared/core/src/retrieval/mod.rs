//! Retrieval's domain logic, free of I/O: what the query asks for (scope widening), Okapi BM25 as
//! a reference, reciprocal rank fusion, the two ranking profiles, maximal marginal relevance, the
//! token budget and the Markdown layout for LLMs. The store finds candidates; everything that
//! decides their order and their rendering is here.

pub mod bm25;
pub mod budget;
pub mod fusion;
pub mod lines;
pub mod markdown;
pub mod mmr;
pub mod query;
pub mod ranking;
pub mod summary;

pub use fusion::{Fused, LegHit, fuse};
pub use ranking::{
    LegEvidence, LegScale, RankingParams, RankingProfile, ScoreParts, TimeWindow, is_question,
    relevance,
};
