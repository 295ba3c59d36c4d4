//! The retrieval service's proto conversions, in one place: requests in, checked with
//! InvalidArgument messages that name the field; results out as response messages.

use engram_core::retrieval::markdown::Detail;
use engram_core::validate::parse_page_size;
use engram_core::{Category, ConversationId, MemoryText, Scope, ValidationError};
use engram_proto::v1;
use engram_recall::{
    RankedMemory, RankingOverrides, RankingValues, Recall, Retrieval, RetrieveRequest, ServedBy,
};
use engram_server::convert::{
    category_from_proto, category_to_proto, kind_from_proto, memory_to_proto,
    structured_summary_to_proto,
};
use engram_server::paging::{EntryCursor, RESPONSE_BYTE_BUDGET, fitting_count};
use engram_server::time::to_proto_opt;
use engram_store::memories::{ListFilter, MemoryRecord};

use crate::error::RetrievalError;
use crate::service::SpaceSummary;

pub use engram_core::retrieval::budget::{MAX_TOKEN_BUDGET, MIN_TOKEN_BUDGET};
pub use engram_core::retrieval::query::MAX_QUERY_CHARS;
pub const MAX_EPISODIC_LIMIT: u32 = 100;
pub const MAX_SEMANTIC_LIMIT: u32 = 100;
const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 500;
const DEFAULT_EXPORT_PAGE_SIZE: u32 = 200;
const MAX_EXPORT_PAGE_SIZE: u32 = 1_000;

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
) -> Result<RetrieveRequest, RetrievalError> {
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
) -> Result<RetrieveRequest, RetrievalError> {
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

/// A ListEntries page: its filter (one entry more than the page, to know whether another
/// follows) and its size.
pub fn list_filter(message: &v1::ListEntriesRequest) -> Result<(ListFilter, u32), RetrievalError> {
    let page_size = parse_page_size(
        "page_size",
        message.page_size,
        DEFAULT_PAGE_SIZE,
        MAX_PAGE_SIZE,
    )?;
    let after = EntryCursor::parse_optional("page_token", &message.page_token)?;
    let filter = ListFilter {
        pinned: message.pinned,
        manually_saved: message.manually_saved,
        kind: kind_from_proto("kind", message.kind)?,
        after: after.map(|cursor| (cursor.created_at, cursor.id)),
        limit: i64::from(page_size) + 1,
    };
    Ok((filter, page_size))
}

pub fn list_response(records: &[MemoryRecord], page_size: u32) -> v1::ListEntriesResponse {
    let mut entries: Vec<v1::Memory> = records.iter().map(memory_to_proto).collect();
    entries.truncate(fitting_count(
        &entries,
        page_size as usize,
        RESPONSE_BYTE_BUDGET,
    ));
    // More entries than the page holds: the next page starts after its last one.
    let next_page_token = match entries.len().checked_sub(1) {
        Some(last) if records.len() > entries.len() => EntryCursor {
            created_at: records[last].created_at,
            id: records[last].id,
        }
        .token(),
        _ => String::new(),
    };
    v1::ListEntriesResponse {
        entries,
        next_page_token,
    }
}

pub fn export_page_size(message: &v1::ExportSpaceRequest) -> Result<u32, RetrievalError> {
    Ok(parse_page_size(
        "page_size",
        message.page_size,
        DEFAULT_EXPORT_PAGE_SIZE,
        MAX_EXPORT_PAGE_SIZE,
    )?)
}

pub fn summary_response(summary: SpaceSummary) -> v1::GetSummaryResponse {
    let SpaceSummary {
        markdown,
        memory_enabled,
        contents,
    } = summary;
    let counts = &contents.counts;
    v1::GetSummaryResponse {
        summary: markdown,
        semantic_count: counts.semantic_count as u32,
        episodic_count: counts.episodic_count as u32,
        pinned_count: counts.pinned_count as u32,
        categories: contents
            .categories
            .iter()
            .map(|(category, count)| v1::CategoryCount {
                category: Category::from_stored(category)
                    .map_or(v1::Category::Unspecified, category_to_proto)
                    .into(),
                count: *count as u32,
            })
            .collect(),
        memory_enabled,
        oldest_at: to_proto_opt(counts.oldest_at),
        newest_at: to_proto_opt(counts.newest_at),
        recent_episodes: contents
            .recent_episodes
            .iter()
            .map(|record| v1::EpisodeDigest {
                id: record.id.to_string(),
                title: record.title.clone().unwrap_or_default(),
                summary: record.text.clone(),
                end_at: to_proto_opt(record.end_at.or(Some(record.created_at))),
                structured_summary: record
                    .structured_summary
                    .as_ref()
                    .map(structured_summary_to_proto),
            })
            .collect(),
    }
}

fn served_by_to_proto(served_by: &ServedBy, profile: &str) -> v1::ServedBy {
    v1::ServedBy {
        path: served_by.path.clone(),
        searched: served_by.searched.clone(),
        // Every search covers the space (the field stays for clients that read it).
        scope_widened: false,
        sparse_hits: served_by.sparse_hits as u32,
        dense_hits: served_by.dense_hits as u32,
        trigram_hits: served_by.trigram_hits as u32,
        used_fallback: served_by.used_fallback,
        fallback_reason: served_by.fallback_reason.clone().unwrap_or_default(),
        ranking_profile: profile.to_owned(),
    }
}

fn ranked_to_proto(memory: &RankedMemory) -> v1::RetrievedMemory {
    let scores = &memory.scores;
    v1::RetrievedMemory {
        memory: Some(memory_to_proto(&memory.record)),
        rank: memory.rank as u32,
        score: Some(v1::ScoreBreakdown {
            total: scores.total,
            rrf: scores.rrf,
            retrievability: scores.retrievability,
            relevance: scores.relevance,
            recency: scores.recency,
            importance: scores.importance,
            sparse_rank: memory.sparse.as_ref().map_or(0, |hit| hit.rank),
            sparse_score: memory.sparse.as_ref().map_or(0.0, |hit| hit.score),
            dense_rank: memory.dense.as_ref().map_or(0, |hit| hit.rank),
            dense_score: memory.dense.as_ref().map_or(0.0, |hit| hit.score),
            time_match: scores.time_match,
        }),
        details_shown: memory.details_shown,
        messages_omitted: false,
        history: memory.history.iter().map(memory_to_proto).collect(),
        lines_shown: memory
            .lines_shown
            .iter()
            .map(|&line| u32::try_from(line).unwrap_or(u32::MAX))
            .collect(),
    }
}

pub fn retrieve_response(
    retrieval: &Retrieval,
    request: &RetrieveRequest,
) -> v1::RetrieveMemoryResponse {
    let mut response = v1::RetrieveMemoryResponse {
        markdown: retrieval.markdown.clone(),
        semantic: retrieval.semantic.iter().map(ranked_to_proto).collect(),
        episodic: retrieval.episodic.iter().map(ranked_to_proto).collect(),
        served_by: Some(served_by_to_proto(
            &retrieval.served_by,
            request.ranking.profile.as_str(),
        )),
        tokens: retrieval.tokens as u32,
        truncated: retrieval.truncated,
    };
    keep_within_budget(&mut response, RESPONSE_BYTE_BUDGET);
    response
}

pub fn context_response(
    retrieval: &Retrieval,
    request: &RetrieveRequest,
) -> v1::ContextPreRetrieveResponse {
    let response = retrieve_response(retrieval, request);
    v1::ContextPreRetrieveResponse {
        markdown: response.markdown,
        semantic: response.semantic,
        served_by: response.served_by,
        tokens: response.tokens,
        truncated: response.truncated,
    }
}

/// The token budget bounds the Markdown, but the structured results also carry each episode's
/// whole conversation excerpt: up to 100 episodes of them could pass what clients accept. Over
/// the budget, excerpts are left out from the lowest-ranked episode up (each marked
/// `messages_omitted`); should that not suffice, the lowest-ranked results go and the answer says
/// it was truncated.
fn keep_within_budget(response: &mut v1::RetrieveMemoryResponse, budget: usize) {
    use prost::Message as _;
    let mut size = response.encoded_len();
    for index in (0..response.episodic.len()).rev() {
        if size <= budget {
            return;
        }
        let retrieved = &mut response.episodic[index];
        if let Some(memory) = retrieved.memory.as_mut()
            && !memory.messages.is_empty()
        {
            memory.messages.clear();
            retrieved.messages_omitted = true;
            size = response.encoded_len();
        }
    }
    while size > budget && (!response.episodic.is_empty() || !response.semantic.is_empty()) {
        if response.episodic.pop().is_none() {
            response.semantic.pop();
        }
        response.truncated = true;
        size = response.encoded_len();
    }
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

    fn episode(rank: u32, message_chars: usize) -> v1::RetrievedMemory {
        v1::RetrievedMemory {
            memory: Some(v1::Memory {
                text: "summary".into(),
                messages: vec![v1::Message {
                    role: v1::SpeakerRole::User.into(),
                    content: "x".repeat(message_chars),
                }],
                ..Default::default()
            }),
            rank,
            ..Default::default()
        }
    }

    #[test]
    fn excerpts_of_the_lowest_ranks_go_first_when_a_response_is_too_large() {
        let mut response = v1::RetrieveMemoryResponse {
            episodic: (1..=4).map(|rank| episode(rank, 1_000)).collect(),
            ..Default::default()
        };
        keep_within_budget(&mut response, 2_500);
        let omitted: Vec<bool> = response
            .episodic
            .iter()
            .map(|e| e.messages_omitted)
            .collect();
        assert_eq!(omitted, [false, false, true, true]);
        assert!(!response.truncated);
        assert!(prost::Message::encoded_len(&response) <= 2_500);

        keep_within_budget(&mut response, 40);
        assert!(response.truncated, "results had to go");
        assert!(prost::Message::encoded_len(&response) <= 40);
    }
}
