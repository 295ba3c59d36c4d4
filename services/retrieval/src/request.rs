//! Validation of retrieval requests at the edge: proto fields in, a checked `RetrieveRequest` out,
//! with InvalidArgument messages that name the field.

use engram_core::retrieval::markdown::Detail;
use engram_core::{ConversationId, MemoryText, Scope, ValidationError};
use engram_proto::v1;
use engram_recall::{RankingOverrides, Recall, RetrieveRequest};
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
    let profile = match v1::RankingProfile::try_from(options.profile) {
        Ok(v1::RankingProfile::Unspecified) => None,
        Ok(v1::RankingProfile::Fsrs) => Some("fsrs".to_owned()),
        Ok(v1::RankingProfile::Triscore) => Some("triscore".to_owned()),
        Err(_) => {
            return Err(ValidationError::new(
                "ranking.profile",
                format!("{} is not a known ranking profile", options.profile),
            ));
        }
    };
    Ok((
        RankingOverrides {
            profile,
            candidates_per_leg: options.candidates_per_leg,
            rrf_k: options.rrf_k,
            mmr_lambda: options.mmr_lambda,
            alpha: options.alpha,
            beta: options.beta,
            gamma: options.gamma,
            recency_tau_days: options.recency_tau_days,
            min_similarity: options.min_similarity,
            time_match_boost: options.time_match_boost,
            sparse_weight: options.sparse_weight,
            question_weight: options.question_weight,
            other_speaker_weight: options.other_speaker_weight,
        },
        options.sparse_only,
    ))
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
