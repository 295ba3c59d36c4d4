//! The gRPC edge of the retrieval service.

use std::pin::Pin;

use chrono::{DateTime, Utc};
use engram_core::retrieval::summary::{self, SpaceOverview, SummaryEpisode, SummaryFact};
use engram_core::validate::parse_page_size;
use engram_core::{Category, Scope};
use engram_proto::v1;
use engram_proto::v1::retrieval_service_server::RetrievalService;
use engram_recall::{RankedMemory, Recall, Retrieval, ServedBy};
use engram_server::authorized_scope;
use engram_server::convert::{
    category_to_proto, kind_from_proto, memory_to_proto, structured_summary_to_proto,
};
use engram_server::paging::{EntryCursor, RESPONSE_BYTE_BUDGET, fitting_count};
use engram_server::time::to_proto_opt;
use engram_store::memories::{self, ListFilter};
use engram_store::retrieval::context;
use engram_store::summary::space_contents;
use engram_store::transfer::export_page;
use futures::Stream;
use sqlx::PgPool;
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::error::RetrievalError;
use crate::request;

const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 500;
const DEFAULT_EXPORT_PAGE_SIZE: u32 = 200;
const MAX_EXPORT_PAGE_SIZE: u32 = 1_000;
/// Facts shown per category, and episodes, in a summary.
const SUMMARY_FACTS_PER_CATEGORY: i64 = 5;
const SUMMARY_EPISODES: i64 = 5;

#[derive(Debug, Clone)]
pub struct RetrievalApi {
    pool: PgPool,
    recall: Recall,
}

impl RetrievalApi {
    pub fn new(pool: PgPool, recall: Recall) -> Self {
        Self { pool, recall }
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

fn retrieve_response(retrieval: &Retrieval, profile: &str) -> v1::RetrieveMemoryResponse {
    let mut response = v1::RetrieveMemoryResponse {
        markdown: retrieval.markdown.clone(),
        semantic: retrieval.semantic.iter().map(ranked_to_proto).collect(),
        episodic: retrieval.episodic.iter().map(ranked_to_proto).collect(),
        served_by: Some(served_by_to_proto(&retrieval.served_by, profile)),
        tokens: retrieval.tokens as u32,
        truncated: retrieval.truncated,
    };
    keep_within_budget(&mut response, RESPONSE_BYTE_BUDGET);
    response
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

type ExportStream = Pin<Box<dyn Stream<Item = Result<v1::ExportSpaceResponse, Status>> + Send>>;

/// Pages through a space oldest first; a failing page ends the stream with its status.
fn export_stream(
    pool: PgPool,
    scope: Scope,
    page_size: u32,
    with_embeddings: bool,
) -> ExportStream {
    struct Cursor {
        after: Option<(DateTime<Utc>, Uuid)>,
        done: bool,
    }
    let start = Cursor {
        after: None,
        done: false,
    };
    Box::pin(futures::stream::unfold(start, move |cursor| {
        let pool = pool.clone();
        let scope = scope.clone();
        async move {
            if cursor.done {
                return None;
            }
            let page = export_page(
                &pool,
                &scope,
                cursor.after,
                i64::from(page_size),
                with_embeddings,
            )
            .await;
            match page {
                Ok(page) if page.is_empty() => None,
                Ok(page) => {
                    let fetched = page.len();
                    let mut memories: Vec<v1::ExportedMemory> = page
                        .iter()
                        .map(|exported| v1::ExportedMemory {
                            memory: Some(memory_to_proto(&exported.record)),
                            embedding: exported
                                .embedding
                                .as_ref()
                                .map(|vector| vector.as_slice().to_vec())
                                .unwrap_or_default(),
                        })
                        .collect();
                    // A message ends early when the next entry would take it past the budget;
                    // the stream goes on from the last entry sent.
                    memories.truncate(fitting_count(
                        &memories,
                        page_size as usize,
                        RESPONSE_BYTE_BUDGET,
                    ));
                    let last = &page[memories.len() - 1].record;
                    let next = Cursor {
                        after: Some((last.created_at, last.id)),
                        done: fetched < page_size as usize && memories.len() == fetched,
                    };
                    Some((Ok(v1::ExportSpaceResponse { memories }), next))
                }
                Err(error) => {
                    let status = Status::from(RetrievalError::from(error));
                    let next = Cursor {
                        after: cursor.after,
                        done: true,
                    };
                    Some((Err(status), next))
                }
            }
        }
    }))
}

fn category_of(stored: Option<&str>) -> String {
    stored.unwrap_or("fact").to_owned()
}

#[tonic::async_trait]
impl RetrievalService for RetrievalApi {
    #[tracing::instrument(skip_all, err(Display))]
    async fn retrieve_memory(
        &self,
        request: Request<v1::RetrieveMemoryRequest>,
    ) -> Result<Response<v1::RetrieveMemoryResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let retrieve = request::retrieve_memory(scope, request.get_ref(), &self.recall)
            .map_err(RetrievalError::from)?;
        let retrieval = self
            .recall
            .retrieve(&retrieve)
            .await
            .map_err(RetrievalError::from)?;
        Ok(Response::new(retrieve_response(
            &retrieval,
            retrieve.ranking.profile.as_str(),
        )))
    }

    #[tracing::instrument(skip_all, err(Display))]
    async fn context_pre_retrieve(
        &self,
        request: Request<v1::ContextPreRetrieveRequest>,
    ) -> Result<Response<v1::ContextPreRetrieveResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let retrieve = request::context_pre_retrieve(scope, request.get_ref(), &self.recall)
            .map_err(RetrievalError::from)?;
        let retrieval = self
            .recall
            .retrieve(&retrieve)
            .await
            .map_err(RetrievalError::from)?;
        let response = retrieve_response(&retrieval, retrieve.ranking.profile.as_str());
        Ok(Response::new(v1::ContextPreRetrieveResponse {
            markdown: response.markdown,
            semantic: response.semantic,
            served_by: response.served_by,
            tokens: response.tokens,
            truncated: response.truncated,
        }))
    }

    async fn list_entries(
        &self,
        request: Request<v1::ListEntriesRequest>,
    ) -> Result<Response<v1::ListEntriesResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let message = request.into_inner();
        let page_size = parse_page_size(
            "page_size",
            message.page_size,
            DEFAULT_PAGE_SIZE,
            MAX_PAGE_SIZE,
        )
        .map_err(RetrievalError::from)?;
        let after = EntryCursor::parse_optional("page_token", &message.page_token)
            .map_err(RetrievalError::from)?;
        let filter = ListFilter {
            pinned: message.pinned,
            manually_saved: message.manually_saved,
            kind: kind_from_proto("kind", message.kind).map_err(RetrievalError::from)?,
            after: after.map(|cursor| (cursor.created_at, cursor.id)),
            limit: i64::from(page_size) + 1,
        };
        let records = memories::list(&self.pool, &scope, &filter)
            .await
            .map_err(RetrievalError::from)?;
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
        Ok(Response::new(v1::ListEntriesResponse {
            entries,
            next_page_token,
        }))
    }

    #[tracing::instrument(skip_all, err(Display))]
    async fn get_summary(
        &self,
        request: Request<v1::GetSummaryRequest>,
    ) -> Result<Response<v1::GetSummaryResponse>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let settings = context(&self.pool, &scope, None)
            .await
            .map_err(RetrievalError::from)?;
        let contents = space_contents(
            &self.pool,
            &scope,
            SUMMARY_FACTS_PER_CATEGORY,
            SUMMARY_EPISODES,
        )
        .await
        .map_err(RetrievalError::from)?;
        let counts = &contents.counts;
        let overview = SpaceOverview {
            space: scope.space.as_str().to_owned(),
            memory_enabled: settings.memory_enabled,
            semantic_count: counts.semantic_count as u64,
            episodic_count: counts.episodic_count as u64,
            pinned_count: counts.pinned_count as u64,
            categories: contents
                .categories
                .iter()
                .map(|(category, count)| (category.clone(), *count as u64))
                .collect(),
            highlights: contents
                .highlights
                .iter()
                .map(|record| SummaryFact {
                    category: category_of(record.category.as_deref()),
                    text: record.text.clone(),
                    pinned: record.pinned,
                })
                .collect(),
            recent_episodes: contents
                .recent_episodes
                .iter()
                .map(|record| {
                    let established = record
                        .structured_summary
                        .as_ref()
                        .map(structured_summary_to_proto)
                        .unwrap_or_default();
                    SummaryEpisode {
                        title: record.title.clone().unwrap_or_default(),
                        summary: record.text.clone(),
                        end_at: record.end_at.unwrap_or(record.created_at),
                        todos: established.todos,
                        decisions: established.decisions,
                    }
                })
                .collect(),
            oldest_at: counts.oldest_at,
            newest_at: counts.newest_at,
        };
        Ok(Response::new(v1::GetSummaryResponse {
            summary: summary::render(&overview, Utc::now()),
            semantic_count: overview.semantic_count as u32,
            episodic_count: overview.episodic_count as u32,
            pinned_count: overview.pinned_count as u32,
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
            memory_enabled: overview.memory_enabled,
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
        }))
    }

    type ExportSpaceStream = ExportStream;

    async fn export_space(
        &self,
        request: Request<v1::ExportSpaceRequest>,
    ) -> Result<Response<Self::ExportSpaceStream>, Status> {
        let scope = authorized_scope(&request, request.get_ref().scope.clone())?;
        let message = request.into_inner();
        let page_size = parse_page_size(
            "page_size",
            message.page_size,
            DEFAULT_EXPORT_PAGE_SIZE,
            MAX_EXPORT_PAGE_SIZE,
        )
        .map_err(RetrievalError::from)?;
        Ok(Response::new(export_stream(
            self.pool.clone(),
            scope,
            page_size,
            message.include_embeddings,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
