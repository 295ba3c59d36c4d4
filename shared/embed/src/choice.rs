//! Which embedder a service runs, as configuration says, and loading it. Ingest (the backfill)
//! and retrieval (query embeddings) read the same `embed` settings, so they embed with the same
//! model.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{
    EmbedError, Embedder, LocalEmbedder, LocalModelSettings, OpenAiEmbedder, OpenAiSettings,
    TokenVectorEmbedder, YieldToRequests,
};

/// Which embedder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbedProvider {
    /// all-MiniLM-L6-v2 on the CPU, from `model_dir` (the default; no network, no key).
    Local,
    /// An OpenAI-compatible `/v1/embeddings` endpoint.
    Openai,
    /// None: no embeddings are computed.
    Disabled,
}

/// The `embed.openai` settings.
#[derive(Debug, Clone, Deserialize, Serialize, garde::Validate)]
#[garde(allow_unvalidated)]
pub struct OpenAiEmbedSettings {
    pub base_url: String,
    pub model: String,
    /// Sent as a bearer token when set (never part of the defaults).
    #[serde(skip_serializing, default)]
    pub api_key: Option<secrecy::SecretString>,
    /// Must equal the store's embedding dimension.
    #[garde(range(min = 1, max = 16_384))]
    pub dimension: usize,
    #[garde(range(min = 1, max = 600))]
    pub timeout_secs: u64,
    #[garde(range(max = 20))]
    pub max_retries: usize,
}

impl Default for OpenAiEmbedSettings {
    /// OpenAI's small model at the store's 384 dimensions.
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com".to_owned(),
            model: "text-embedding-3-small".to_owned(),
            api_key: None,
            dimension: 384,
            timeout_secs: 30,
            max_retries: 5,
        }
    }
}

/// Everything needed to load an embedder.
#[derive(Debug, Clone)]
pub struct EmbedderChoice {
    pub provider: EmbedProvider,
    /// Directory with model.safetensors, tokenizer.json and config.json (`make models`).
    pub model_dir: PathBuf,
    /// Tokens per text for the local model; longer texts are cut.
    pub max_tokens: usize,
    /// Texts per forward pass or request.
    pub max_batch: usize,
    /// Nice value of the local model's threads (`embed.inference_nice`).
    pub inference_nice: i32,
    /// Whether the local model runs the backfill's passes only between requests (ingest).
    pub yield_to_requests: Option<YieldToRequests>,
    pub openai: OpenAiEmbedSettings,
}

/// What a service embeds with.
#[derive(Clone, Default)]
pub struct Embedders {
    /// For what is stored and searched: memories, episodes, queries.
    pub text: Option<Arc<dyn Embedder>>,
    /// For comparing short texts by topic (segmentation's topic rules, the review grader): with
    /// the local model, its static token vectors ([`TokenVectorEmbedder`]), a transformer pass
    /// cheaper; with an endpoint, the endpoint. Its vectors are comparable only with its own.
    pub topic: Option<Arc<dyn Embedder>>,
}

/// Builds the chosen embedder (`None` when disabled); the local model loads on a blocking thread.
pub async fn load_embedder(
    choice: &EmbedderChoice,
) -> Result<Option<Arc<dyn Embedder>>, EmbedError> {
    Ok(load_embedders(choice).await?.text)
}

/// Builds the chosen embedder and the topic vectors that go with it.
pub async fn load_embedders(choice: &EmbedderChoice) -> Result<Embedders, EmbedError> {
    match choice.provider {
        EmbedProvider::Disabled => Ok(Embedders::default()),
        EmbedProvider::Local => {
            let local = LocalModelSettings {
                model_dir: choice.model_dir.clone(),
                max_batch: choice.max_batch.max(1),
                max_tokens: choice.max_tokens,
                inference_nice: choice.inference_nice,
                yield_to_requests: choice.yield_to_requests.clone(),
            };
            let embedder = tokio::task::spawn_blocking(move || LocalEmbedder::load(&local))
                .await
                .map_err(|error| EmbedError::Load {
                    path: choice.model_dir.display().to_string(),
                    reason: format!("loader thread failed: {error}"),
                })??;
            let topic = TokenVectorEmbedder::new(embedder.clone());
            Ok(Embedders {
                text: Some(Arc::new(embedder)),
                topic: Some(Arc::new(topic)),
            })
        }
        EmbedProvider::Openai => {
            let openai = &choice.openai;
            let embedder = OpenAiEmbedder::new(OpenAiSettings {
                base_url: openai.base_url.clone(),
                model: openai.model.clone(),
                api_key: openai.api_key.clone(),
                dimension: openai.dimension,
                max_batch: choice.max_batch.max(1),
                timeout: Duration::from_secs(openai.timeout_secs),
                max_retries: openai.max_retries,
                min_backoff: Duration::from_millis(200),
                max_backoff: Duration::from_secs(30),
            })?;
            let embedder: Arc<dyn Embedder> = Arc::new(embedder);
            Ok(Embedders {
                text: Some(embedder.clone()),
                topic: Some(embedder),
            })
        }
    }
}
