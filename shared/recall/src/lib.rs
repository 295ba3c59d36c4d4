//! Engram's retrieval pipeline, shared by the retrieval service (RetrieveMemory,
//! ContextPreRetrieve) and ingest (the "what do you remember about X" command):
//!
//! 1. the space's settings and the conversation's incognito state decide whether to search;
//! 2. the query is embedded (micro-batched with concurrent queries, cached) while the sparse leg
//!    (BM25 in Postgres) searches the whole space's facts and episodes, and one statement finds
//!    its stored turns that answer (by their words and their turn vectors, with the turns
//!    around them);
//! 3. the dense leg finds the nearest embeddings (exact for small spaces, HNSW for large ones);
//! 4. RRF fuses the legs; the trigram fallback takes over when no word matched; a query nothing
//!    matches gets nothing;
//! 5. the ranking profile scores, MMR diversifies; the lines of the stored turns that answer are
//!    chosen and grouped by episode; the token budget cuts, Markdown renders;
//! 6. the pending review is written before the response returns; the rest a retrieval leaves
//!    behind (the note that its entries were returned, their cached scores, its metrics row)
//!    goes to a writer task that writes many retrievals' at once (`read_traces`).

#![forbid(unsafe_code)]

mod error;
mod pipeline;
mod query_embedder;
mod read_traces;
mod settings;
mod startup;

pub use error::RecallError;
pub use pipeline::{
    DEFAULT_EPISODIC_LIMIT, DEFAULT_SEMANTIC_LIMIT, RankedMemory, Recall, Retrieval,
    RetrieveRequest, ServedBy, cpu_bound, cpu_bound_over,
};
pub use query_embedder::{QueryEmbedder, QueryEmbedderSettings};
pub use settings::{RankingOverrides, RankingValues, RecallSettings};
pub use startup::{
    DEFAULT_MODEL_DIR, EmbedConfig, check_dimension, load_embedder, load_embedders, start_recall,
};
