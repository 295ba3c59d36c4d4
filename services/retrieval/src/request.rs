//! Validation of retrieval requests at the edge: proto fields in, a checked `RetrieveRequest` out,
//! with InvalidArgument messages that name the field.

use engram_core::retrieval::markdown::Detail;
use engram_core::{ConversationId, MemoryText, Scope, ValidationError};
use engram_proto::v1;
use engram_recall::{RankingOverrides, RankingValues, Recall, RetrieveRequest};
use engram_server::convert::category_from_proto;

pub use engram_core::retrieval::query::MAX_QUERY_CHARS;
pub const MAX_EPISODIC_LIMIT: u32 = 100;
pub const MAX_SEMANTIC_LIMIT: u32 = 100;
pub const MIN_TOKEN_BUDGET: u32 = 50;
pub const MAX_TOKEN_BUDGET: u32 = 32_000;

/// The query, with the same rules as any text Engram takes in: something visible, at most
/// [`MAX_QUERY_CHARS`], without escape sequences or bidi overrides.
pub fn parse_query(raw: &str) -> Result<String, ValidationError> {
    MemoryText::parse("query", raw, MAX_QUERY_CHARS).map(MemoryText::into_string)
}

pub fn parse_conversation(raw: &str) -> Result<Option<ConversationId>, ValidationError> {
    if raw.is_empty() {
        Ok(None)
    } else {
        ConversationId::parse("conversation_id", raw).map(Some)
    }
}

fn within(field: &str, value: u32, min: u32, max: u32) -> Result<u32, ValidationError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ValidationError::new(
            field,
            format!("is {value}; it must be between {min} and {max}"),
        ))
    }
}

fn parse_detail(raw: i32) -> Result<Detail, ValidationError> {
    match v1::DetailLevel::try_from(raw) {
        Ok(v1::DetailLevel::Unspecified | v1::DetailLevel::Auto) => Ok(Detail::Auto),
        Ok(v1::DetailLevel::None) => Ok(Detail::None),
        Ok(v1::DetailLevel::Low) => Ok(Detail::Low),
        Ok(v1::DetailLevel::High) => Ok(Detail::High),
        Err(_) => Err(ValidationError::new(
            "detail",
            format!("{raw} is not a known detail level"),
        )),
    }
}

/// Ranking overrides from a request; `sparse_only` comes back separately.
fn parse_ranking(
    options: Option<&v1::RankingOptions>,
) -> Result<(RankingOverrides, bool), ValidationError> {
    let Some(options) = options else {
        return Ok((RankingOverrides::default(), false));
    };
    // Every field named, so that a field added to the contract does not compile until it is
    // mapped here.
    let &v1::RankingOptions {
        profile,
        candidates_per_leg,
        rrf_k,
        mmr_lambda,
        alpha,
        beta,
        gamma,
        recency_tau_days,
        sparse_only,
        min_similarity,
        time_match_boost,
        sparse_weight,
        question_weight,
        other_speaker_weight,
    } = options;
    let profile = match v1::RankingProfile::try_from(profile) {
        Ok(v1::RankingProfile::Unspecified) => None,
        Ok(v1::RankingProfile::Fsrs) => Some("fsrs".to_owned()),
        Ok(v1::RankingProfile::Triscore) => Some("triscore".to_owned()),
        Err(_) => {
            return Err(ValidationError::new(
                "ranking.profile",
                format!("{profile} is not a known ranking profile"),
            ));
        }
    };
    // The names of engram-core's RANKING_SETTINGS, which hold each one's bounds.
    let values = RankingValues::given([
        ("rrf_k", rrf_k),
        ("mmr_lambda", mmr_lambda),
        ("alpha", alpha),
        ("beta", beta),
        ("gamma", gamma),
        ("recency_tau_days", recency_tau_days),
        ("min_similarity", min_similarity),
        ("time_match_boost", time_match_boost),
        ("sparse_weight", sparse_weight),
        ("question_weight", question_weight),
        ("other_speaker_weight", other_speaker_weight),
    ]);
    let overrides = RankingOverrides {
        profile,
        candidates_per_leg,
        values,
    };
    Ok((overrides, sparse_only))
}

/// The parts RetrieveMemory and ContextPreRetrieve share.
pub struct CommonFields<'a> {
    pub scope: Scope,
    pub query: &'a str,
    pub conversation_id: &'a str,
    pub category: i32,
    pub token_budget: Option<u32>,
    pub ranking: Option<&'a v1::RankingOptions>,
}

/// The configured defaults (`Recall::default_request`) with what the request overrides.
fn common(fields: CommonFields<'_>, recall: &Recall) -> Result<RetrieveRequest, ValidationError> {
    let query = parse_query(fields.query)?;
    let conversation = parse_conversation(fields.conversation_id)?;
    let category = category_from_proto("category", fields.category)?;
    let mut request = recall.default_request(fields.scope, conversation, query);
    request.category = category;
    request.token_budget = within(
        "token_budget",
        fields
            .token_budget
            .unwrap_or(recall.settings().token_budget),
        MIN_TOKEN_BUDGET,
        MAX_TOKEN_BUDGET,
    )? as usize;
    let (overrides, sparse_only) = parse_ranking(fields.ranking)?;
    request.ranking = overrides.apply(request.ranking, "ranking")?;
    request.dense = !sparse_only;
    Ok(request)
}

pub fn retrieve_memory(
    scope: Scope,
    message: &v1::RetrieveMemoryRequest,
    recall: &Recall,
) -> Result<RetrieveRequest, ValidationError> {
    let mut request = common(
        CommonFields {
            scope,
            query: &message.query,
            conversation_id: &message.conversation_id,
            category: message.category,
            token_budget: message.token_budget,
            ranking: message.ranking.as_ref(),
        },
        recall,
    )?;
    if let Some(limit) = message.episodic_limit {
        request.episodic_limit = within("episodic_limit", limit, 0, MAX_EPISODIC_LIMIT)? as usize;
    }
    if let Some(limit) = message.semantic_limit {
        request.semantic_limit = within("semantic_limit", limit, 0, MAX_SEMANTIC_LIMIT)? as usize;
    }
    request.detail = parse_detail(message.detail)?;
    request.include_history = message.include_history;
    request.include_inactive = message.include_inactive;
    Ok(request)
}

pub fn context_pre_retrieve(
    scope: Scope,
    message: &v1::ContextPreRetrieveRequest,
    recall: &Recall,
) -> Result<RetrieveRequest, ValidationError> {
    let mut request = common(
        CommonFields {
            scope,
            query: &message.query,
            conversation_id: &message.conversation_id,
            category: message.category,
            token_budget: message.token_budget,
            ranking: message.ranking.as_ref(),
        },
        recall,
    )?;
    if let Some(limit) = message.semantic_limit {
        request.semantic_limit = within("semantic_limit", limit, 1, MAX_SEMANTIC_LIMIT)? as usize;
    }
    request.episodic_limit = 0;
    request.detail = Detail::None;
    request.side_effects = false;
    request.include_history = message.include_history;
    request.include_inactive = message.include_inactive;
    Ok(request)
}

#[cfg(test)]
mod tests {
    use engram_core::retrieval::RankingParams;
    use engram_core::retrieval::ranking::RANKING_SETTINGS;

    use super::*;

    #[test]
    fn every_ranking_field_overrides_the_setting_of_its_name() {
        // 1 is within the bounds of every numeric setting.
        let options = v1::RankingOptions {
            profile: v1::RankingProfile::Fsrs.into(),
            candidates_per_leg: Some(1),
            rrf_k: Some(1.0),
            mmr_lambda: Some(1.0),
            alpha: Some(1.0),
            beta: Some(1.0),
            gamma: Some(1.0),
            recency_tau_days: Some(1.0),
            sparse_only: true,
            min_similarity: Some(1.0),
            time_match_boost: Some(1.0),
            sparse_weight: Some(1.0),
            question_weight: Some(1.0),
            other_speaker_weight: Some(1.0),
        };
        let (overrides, sparse_only) = parse_ranking(Some(&options)).unwrap();
        assert!(sparse_only);
        let params = overrides
            .apply(RankingParams::default(), "ranking")
            .unwrap();
        assert_eq!(params.candidates_per_leg, 1);
        for setting in RANKING_SETTINGS {
            assert_eq!((setting.get)(&params), 1.0, "{}", setting.name);
        }
    }

    #[test]
    fn a_ranking_value_out_of_bounds_is_named_in_the_error() {
        let options = v1::RankingOptions {
            min_similarity: Some(1.5),
            ..v1::RankingOptions::default()
        };
        let (overrides, _) = parse_ranking(Some(&options)).unwrap();
        let error = overrides
            .apply(RankingParams::default(), "ranking")
            .unwrap_err();
        assert_eq!(error.field, "ranking.min_similarity");
        assert_eq!(error.reason, "must be between 0 and 1, got 1.5");
    }
}
