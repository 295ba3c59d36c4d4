//! The retrieval service's operations, one method each, on checked inputs: what every RPC of
//! `grpc.rs` calls. Proto messages stay at the edge (`proto.rs`), except the export, whose pages
//! are sized by their encoding.

use std::pin::Pin;

use chrono::{DateTime, Utc};
use engram_core::Scope;
use engram_core::retrieval::summary::{self, SpaceOverview, SummaryEpisode, SummaryFact};
use engram_proto::v1;
use engram_recall::{Recall, Retrieval, RetrieveRequest};
use engram_server::convert::{memory_to_proto, structured_summary_to_proto};
use engram_server::paging::{RESPONSE_BYTE_BUDGET, fitting_count};
use engram_store::memories::{self, ListFilter, MemoryRecord};
use engram_store::retrieval::context;
use engram_store::summary::{SpaceContents, space_contents};
use engram_store::transfer::export_page;
use futures::Stream;
use sqlx::PgPool;
use tonic::Status;
use uuid::Uuid;

use crate::error::RetrievalError;

/// Facts shown per category, and episodes, in a summary.
const SUMMARY_FACTS_PER_CATEGORY: i64 = 5;
const SUMMARY_EPISODES: i64 = 5;

/// Reads memory for assistants; cheap to clone.
#[derive(Debug, Clone)]
pub struct Retriever {
    pool: PgPool,
    recall: Recall,
}

/// A space at a glance: the Markdown an assistant reads and what it was rendered from.
#[derive(Debug)]
pub struct SpaceSummary {
    pub markdown: String,
    pub memory_enabled: bool,
    pub contents: SpaceContents,
}

pub type ExportStream = Pin<Box<dyn Stream<Item = Result<v1::ExportSpaceResponse, Status>> + Send>>;

impl Retriever {
    pub fn new(pool: PgPool, recall: Recall) -> Self {
        Self { pool, recall }
    }

    /// The retrieval pipeline: its configured defaults fill what a request leaves out.
    pub fn recall(&self) -> &Recall {
        &self.recall
    }

    /// RetrieveMemory and ContextPreRetrieve: the hybrid search of `engram-recall`.
    pub async fn retrieve(&self, request: &RetrieveRequest) -> Result<Retrieval, RetrievalError> {
        Ok(self.recall.retrieve(request).await?)
    }

    /// ListEntries: a page of the space's entries, newest first.
    pub async fn list_entries(
        &self,
        scope: &Scope,
        filter: &ListFilter,
    ) -> Result<Vec<MemoryRecord>, RetrievalError> {
        Ok(memories::list(&self.pool, scope, filter).await?)
    }

    /// GetSummary: counts, the highlights of each category and the latest episodes.
    pub async fn summary(&self, scope: &Scope) -> Result<SpaceSummary, RetrievalError> {
        let settings = context(&self.pool, scope, None).await?;
        let contents = space_contents(
            &self.pool,
            scope,
            SUMMARY_FACTS_PER_CATEGORY,
            SUMMARY_EPISODES,
        )
        .await?;
        let overview = overview_of(scope, settings.memory_enabled, &contents);
        Ok(SpaceSummary {
            markdown: summary::render(&overview, Utc::now()),
            memory_enabled: settings.memory_enabled,
            contents,
        })
    }

    /// ExportSpace: the space oldest first, a page a message.
    pub fn export(&self, scope: Scope, page_size: u32, with_embeddings: bool) -> ExportStream {
        export_stream(self.pool.clone(), scope, page_size, with_embeddings)
    }
}

fn overview_of(scope: &Scope, memory_enabled: bool, contents: &SpaceContents) -> SpaceOverview {
    let counts = &contents.counts;
    SpaceOverview {
        space: scope.space.as_str().to_owned(),
        memory_enabled,
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
                category: record.category.as_deref().unwrap_or("fact").to_owned(),
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
    }
}

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
