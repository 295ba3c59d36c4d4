//! What a service needs before it can retrieve: the embedder the `embed.*` settings choose,
//! checked against the store, and the query embedder in front of it. Ingest (for "what do you
//! remember about X") and retrieval start the pipeline the same way.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use engram_embed::{EmbedProvider, Embedder, EmbedderChoice, OpenAiEmbedSettings};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::{QueryEmbedder, QueryEmbedderSettings, Recall, RecallSettings};

/// Where the local model lives after `make models`.
pub const DEFAULT_MODEL_DIR: &str = "/var/tmp/engram-local/models/all-MiniLM-L6-v2";

/// The `embed.*` settings both services read (ingest reads more, for its backfill).
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct EmbedConfig {
    pub provider: EmbedProvider,
    /// Directory with model.safetensors, tokenizer.json and config.json (`make models`).
    pub model_dir: PathBuf,
    /// Texts per forward pass or request.
    #[garde(range(min = 1, max = 2_048))]
    pub batch_size: usize,
    /// Tokens per text for the local model; longer texts are cut. The model has 512 positions.
    #[garde(range(min = 8, max = 512))]
    pub max_tokens: usize,
    /// Query embeddings kept in memory (repeated queries are not embedded again).
    #[garde(range(max = 10_000_000))]
    pub query_cache_entries: u64,
    /// Longest wait for a query embedding before retrieval goes on with the sparse leg alone.
    #[garde(range(min = 1, max = 60_000))]
    pub query_timeout_ms: u64,
    /// Nice value of the local model's threads: 0 where a request waits for the model
    /// (retrieval's query embeddings), 10 where inference is background work (ingest, review).
    #[garde(range(min = -20, max = 19))]
    pub inference_nice: i32,
    #[garde(dive)]
    pub openai: OpenAiEmbedSettings,
}

impl EmbedConfig {
    pub fn embedder_choice(&self) -> EmbedderChoice {
        EmbedderChoice {
            provider: self.provider,
            model_dir: self.model_dir.clone(),
            max_tokens: self.max_tokens,
            max_batch: self.batch_size,
            inference_nice: self.inference_nice,
            // Retrieval embeds what its requests wait for; review grades with no request
            // beside it that answers in milliseconds.
            yield_to_requests: None,
            openai: self.openai.clone(),
        }
    }

    pub fn query_embedder(&self) -> QueryEmbedderSettings {
        QueryEmbedderSettings {
            max_batch: self.batch_size,
            cache_entries: self.query_cache_entries,
            timeout: Duration::from_millis(self.query_timeout_ms),
        }
    }
}

impl Default for EmbedConfig {
    /// The local model where `make models` installs it, 32 texts a pass, 256 tokens a text.
    fn default() -> Self {
        Self {
            provider: EmbedProvider::Local,
            model_dir: PathBuf::from(DEFAULT_MODEL_DIR),
            batch_size: 32,
            max_tokens: 256,
            query_cache_entries: 10_000,
            query_timeout_ms: 2_000,
            inference_nice: 0,
            openai: OpenAiEmbedSettings::default(),
        }
    }
}

/// Loads the configured embedder (`None` when disabled).
pub async fn load_embedder(choice: &EmbedderChoice) -> anyhow::Result<Option<Arc<dyn Embedder>>> {
    engram_embed::load_embedder(choice)
        .await
        .context("cannot load the embedder; run `make models` or set ENGRAM_EMBED__MODEL_DIR")
}

/// Loads the configured embedder and its topic vectors (see [`engram_embed::Embedders`]).
pub async fn load_embedders(choice: &EmbedderChoice) -> anyhow::Result<engram_embed::Embedders> {
    engram_embed::load_embedders(choice)
        .await
        .context("cannot load the embedder; run `make models` or set ENGRAM_EMBED__MODEL_DIR")
}

/// A model whose vectors do not fit the store would fail every embedding write and every vector
/// search: refuse to start instead.
pub async fn check_dimension(pool: &PgPool, embedder: &dyn Embedder) -> anyhow::Result<()> {
    let stored = engram_store::embeddings::stored_dimension(pool).await?;
    if stored != embedder.dimension() {
        anyhow::bail!(
            "embedding dimension mismatch: {} produces {} dimensions, the store holds vector({stored}); \
             choose a {stored}-dimension model or migrate the store",
            embedder.model_id(),
            embedder.dimension()
        );
    }
    Ok(())
}

/// The retrieval pipeline over `embedders` (the text embedder already checked), with its query
/// embedder started on the current runtime. It writes through `pool` and reads through `reads`
/// (retrieval's read-only pool, `engram_store::read_only_pool_beside`; `pool` again where
/// retrieval is occasional). Without a text embedder retrieval serves the sparse leg and says
/// so; without turn vectors (`embedders.topic`) the lines of the stored turns are found by their
/// words alone.
pub fn start_recall(
    pool: PgPool,
    reads: PgPool,
    embedders: engram_embed::Embedders,
    queries: QueryEmbedderSettings,
    settings: RecallSettings,
) -> anyhow::Result<Recall> {
    let queries = embedders
        .text
        .map(|embedder| QueryEmbedder::start(embedder, queries));
    Recall::new(pool, reads, queries, settings)
        .map(|recall| recall.with_turn_vectors(embedders.topic))
        .map_err(|error| anyhow::anyhow!("invalid recall settings: {error}"))
}
