//! Retrieval's tunables (`recall.*` settings) and the per-request overrides clients may send,
//! validated against bounds that keep a request from asking for something absurd.

use engram_core::ValidationError;
use engram_core::retrieval::budget::DEFAULT_TOKEN_BUDGET;
use engram_core::retrieval::{RankingParams, RankingProfile};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
pub struct RecallSettings {
    /// `fsrs` or `triscore`.
    pub profile: String,
    pub rrf_k: f64,
    pub mmr_lambda: f64,
    pub alpha: f64,
    pub beta: f64,
    pub gamma: f64,
    pub recency_tau_days: f64,
    /// The relevance floor for candidates only the vector leg found (their cosine).
    pub min_similarity: f64,
    /// How much more an entry from the days a query names scores.
    pub time_match_boost: f64,
    /// triscore's relevance: the sparse leg's share (the cosine has the rest).
    pub sparse_weight: f64,
    /// triscore's relevance of a fact that is itself a question is multiplied by this.
    pub question_weight: f64,
    /// triscore's relevance of a transcript line is multiplied by this when the query names a
    /// speaker and not the line's.
    pub other_speaker_weight: f64,
    pub candidates_per_leg: u32,
    pub token_budget: u32,
    /// Least pg_trgm word similarity of a trigram fallback hit.
    pub trigram_threshold: f64,
    /// Spaces up to this many entries get exact nearest neighbours; larger ones use HNSW.
    pub exact_search_max_entries: i64,
    /// HNSW candidates per scan step (pgvector's hnsw.ef_search).
    pub hnsw_ef_search: u32,
    pub bm25_k1: f64,
    pub bm25_b: f64,
}

impl RecallSettings {
    /// Defaults under `recall.` for the services' settings, chosen by `make eval`. On the
    /// multi-session dialogs (docs/eval/dialogs.md, "How the ranking defaults were chosen", which
    /// weighs the turns and the conversation's episodes and facts alike): triscore, its relevance
    /// 0.4 × BM25 over the best BM25 + 0.6 × cosine over the best cosine among the candidates,
    /// discounted to 0.6 for a fact that is itself a question and to 0.5 for a transcript line of
    /// a speaker the query does not name when it names one; importance weighted 1 to
    /// relevance's 4; MMR at λ = 1 (order by score: diversity cost recall on the dialogs, and the
    /// write path already merges near-duplicates; requests may still ask for it); a relevance
    /// floor of 0.2 (the cosine an entry no query word matched needs: it lifted the episodes and
    /// facts, which low-cosine facts had crowded; higher floors lose paraphrases that share no
    /// word with the question); and an entry from the days a question names scoring one and a
    /// half times as much (time_match_boost 0.5). RRF k = 1 orders the fsrs profile. Recency (β = 0.5, τ = 30
    /// days) and the candidates per leg (20) come from the task set (docs/eval/retrieval.md): the
    /// dialogs are months old when asked about, so they cannot choose them.
    pub fn defaults() -> Vec<(&'static str, config::Value)> {
        vec![
            ("recall.profile", "triscore".into()),
            ("recall.rrf_k", 1.0.into()),
            ("recall.mmr_lambda", 1.0.into()),
            ("recall.alpha", 4.0.into()),
            ("recall.beta", 0.5.into()),
            ("recall.gamma", 1.0.into()),
            ("recall.recency_tau_days", 30.0.into()),
            ("recall.min_similarity", 0.2.into()),
            ("recall.time_match_boost", 0.5.into()),
            ("recall.sparse_weight", 0.3.into()),
            ("recall.question_weight", 0.6.into()),
            ("recall.other_speaker_weight", 0.5.into()),
            ("recall.candidates_per_leg", 20i64.into()),
            (
                "recall.token_budget",
                i64::from(DEFAULT_TOKEN_BUDGET).into(),
            ),
            ("recall.trigram_threshold", 0.3.into()),
            ("recall.exact_search_max_entries", 20_000i64.into()),
            ("recall.hnsw_ef_search", 200i64.into()),
            ("recall.bm25_k1", engram_core::retrieval::bm25::K1.into()),
            ("recall.bm25_b", engram_core::retrieval::bm25::B.into()),
        ]
    }

    /// The configured ranking, checked like a request's (a bad configuration fails at start-up).
    pub fn default_ranking(&self) -> Result<RankingParams, ValidationError> {
        RankingOverrides {
            profile: Some(self.profile.clone()),
            ..RankingOverrides::default()
        }
        .apply(
            RankingParams {
                profile: RankingProfile::Fsrs,
                candidates_per_leg: self.candidates_per_leg,
                rrf_k: self.rrf_k,
                mmr_lambda: self.mmr_lambda,
                alpha: self.alpha,
                beta: self.beta,
                gamma: self.gamma,
                recency_tau_days: self.recency_tau_days,
                min_similarity: self.min_similarity,
                time_match_boost: self.time_match_boost,
                sparse_weight: self.sparse_weight,
                question_weight: self.question_weight,
                other_speaker_weight: self.other_speaker_weight,
            },
            "recall",
        )
    }
}

/// Ranking parameters a request may set; `None` keeps the configured value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankingOverrides {
    pub profile: Option<String>,
    pub candidates_per_leg: Option<u32>,
    pub rrf_k: Option<f64>,
    pub mmr_lambda: Option<f64>,
    pub alpha: Option<f64>,
    pub beta: Option<f64>,
    pub gamma: Option<f64>,
    pub recency_tau_days: Option<f64>,
    pub min_similarity: Option<f64>,
    pub time_match_boost: Option<f64>,
    pub sparse_weight: Option<f64>,
    pub question_weight: Option<f64>,
    pub other_speaker_weight: Option<f64>,
}

fn bounded(field: String, value: f64, min: f64, max: f64) -> Result<f64, ValidationError> {
    if value.is_finite() && value >= min && value <= max {
        Ok(value)
    } else {
        Err(ValidationError::new(
            field,
            format!("must be between {min} and {max}, got {value}"),
        ))
    }
}

impl RankingOverrides {
    /// The defaults with these overrides, each within bounds; `prefix` names the fields in errors.
    pub fn apply(
        &self,
        defaults: RankingParams,
        prefix: &str,
    ) -> Result<RankingParams, ValidationError> {
        let field = |name: &str| format!("{prefix}.{name}");
        let mut params = defaults;
        if let Some(profile) = &self.profile {
            params.profile = RankingProfile::parse(profile).ok_or_else(|| {
                ValidationError::new(
                    field("profile"),
                    format!("must be fsrs or triscore, got {profile:?}"),
                )
            })?;
        }
        if let Some(candidates) = self.candidates_per_leg {
            params.candidates_per_leg = bounded(
                field("candidates_per_leg"),
                f64::from(candidates),
                1.0,
                1000.0,
            )? as u32;
        }
        let set = |value: Option<f64>, current: f64, name: &str, min: f64, max: f64| match value {
            Some(value) => bounded(field(name), value, min, max),
            None => bounded(field(name), current, min, max),
        };
        params.rrf_k = set(self.rrf_k, params.rrf_k, "rrf_k", 1.0, 1000.0)?;
        params.mmr_lambda = set(self.mmr_lambda, params.mmr_lambda, "mmr_lambda", 0.0, 1.0)?;
        params.alpha = set(self.alpha, params.alpha, "alpha", 0.0, 100.0)?;
        params.beta = set(self.beta, params.beta, "beta", 0.0, 100.0)?;
        params.gamma = set(self.gamma, params.gamma, "gamma", 0.0, 100.0)?;
        params.recency_tau_days = set(
            self.recency_tau_days,
            params.recency_tau_days,
            "recency_tau_days",
            0.01,
            3650.0,
        )?;
        params.min_similarity = set(
            self.min_similarity,
            params.min_similarity,
            "min_similarity",
            0.0,
            1.0,
        )?;
        params.time_match_boost = set(
            self.time_match_boost,
            params.time_match_boost,
            "time_match_boost",
            0.0,
            10.0,
        )?;
        params.sparse_weight = set(
            self.sparse_weight,
            params.sparse_weight,
            "sparse_weight",
            0.0,
            1.0,
        )?;
        params.question_weight = set(
            self.question_weight,
            params.question_weight,
            "question_weight",
            0.0,
            1.0,
        )?;
        params.other_speaker_weight = set(
            self.other_speaker_weight,
            params.other_speaker_weight,
            "other_speaker_weight",
            0.0,
            1.0,
        )?;
        Ok(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_apply_within_bounds_and_name_the_field_otherwise() {
        let defaults = RankingParams::default();
        let params = RankingOverrides {
            profile: Some("triscore".into()),
            alpha: Some(2.0),
            ..RankingOverrides::default()
        }
        .apply(defaults, "ranking")
        .unwrap();
        assert_eq!(params.profile, RankingProfile::Triscore);
        assert_eq!(params.alpha, 2.0);
        assert_eq!(params.beta, defaults.beta);

        let error = RankingOverrides {
            mmr_lambda: Some(1.5),
            ..RankingOverrides::default()
        }
        .apply(defaults, "ranking")
        .unwrap_err();
        assert!(error.to_string().contains("ranking.mmr_lambda"), "{error}");
        let error = RankingOverrides {
            profile: Some("bm25".into()),
            ..RankingOverrides::default()
        }
        .apply(defaults, "ranking")
        .unwrap_err();
        assert!(error.to_string().contains("fsrs or triscore"), "{error}");
        assert!(
            RankingOverrides {
                rrf_k: Some(f64::NAN),
                ..RankingOverrides::default()
            }
            .apply(defaults, "ranking")
            .is_err()
        );
    }
}
