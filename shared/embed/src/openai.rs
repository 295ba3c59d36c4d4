//! Any OpenAI-compatible `/v1/embeddings` endpoint.

use std::time::Duration;

use backon::Retryable as _;
use engram_core::backoff::jittered_backoff;
use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize};

use crate::{EmbedError, EmbedFuture, Embedder, normalize};

/// How to reach the endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiSettings {
    /// Base URL, e.g. `https://api.openai.com` or `http://127.0.0.1:8080` (`/v1/embeddings` is
    /// appended).
    pub base_url: String,
    pub model: String,
    pub api_key: Option<SecretString>,
    /// Dimension the endpoint returns (checked on every answer).
    pub dimension: usize,
    /// Texts per request.
    pub max_batch: usize,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Attempts after the first one for retryable failures.
    pub max_retries: usize,
    /// First backoff delay; doubles per attempt, with jitter, up to `max_backoff`.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

#[derive(Clone)]
pub struct OpenAiEmbedder {
    client: reqwest::Client,
    settings: OpenAiSettings,
    url: String,
}

#[derive(Serialize)]
struct EmbeddingsRequest<'a> {
    model: &'a str,
    input: &'a [String],
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    data: Vec<EmbeddingItem>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    index: usize,
    embedding: Vec<f32>,
}

impl OpenAiEmbedder {
    pub fn new(settings: OpenAiSettings) -> Result<Self, EmbedError> {
        // rustls is built with ring (no C toolchain needed); install it as the process-wide
        // provider once. An error only means a provider is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .build()
            .map_err(|e| EmbedError::Load {
                path: settings.base_url.clone(),
                reason: e.to_string(),
            })?;
        let url = format!("{}/v1/embeddings", settings.base_url.trim_end_matches('/'));
        Ok(Self {
            client,
            settings,
            url,
        })
    }

    async fn request_once(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut request = self.client.post(&self.url).json(&EmbeddingsRequest {
            model: &self.settings.model,
            input: texts,
        });
        if let Some(key) = &self.settings.api_key {
            request = request.bearer_auth(key.expose_secret());
        }
        let response = request
            .send()
            .await
            .map_err(|e| EmbedError::Unreachable(e.to_string()))?;
        let status = response.status();
        if status.as_u16() == 429 {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            return Err(EmbedError::RateLimited { retry_after });
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            let body: String = body.chars().take(512).collect();
            return Err(EmbedError::Http {
                status: status.as_u16(),
                body,
            });
        }
        let parsed: EmbeddingsResponse = response
            .json()
            .await
            .map_err(|e| EmbedError::BadResponse(e.to_string()))?;
        if parsed.data.len() != texts.len() {
            return Err(EmbedError::BadResponse(format!(
                "{} embeddings for {} inputs",
                parsed.data.len(),
                texts.len()
            )));
        }
        let mut vectors: Vec<Option<Vec<f32>>> = vec![None; texts.len()];
        for item in parsed.data {
            if item.embedding.len() != self.settings.dimension {
                return Err(EmbedError::Dimension {
                    expected: self.settings.dimension,
                    actual: item.embedding.len(),
                });
            }
            let slot = vectors.get_mut(item.index).ok_or_else(|| {
                EmbedError::BadResponse(format!("index {} out of range", item.index))
            })?;
            let mut vector = item.embedding;
            normalize(&mut vector);
            *slot = Some(vector);
        }
        vectors
            .into_iter()
            .map(|vector| {
                vector.ok_or_else(|| EmbedError::BadResponse("an input got no embedding".into()))
            })
            .collect()
    }

    async fn request_with_retries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let backoff = jittered_backoff(self.settings.min_backoff, self.settings.max_backoff)
            .with_max_times(self.settings.max_retries);
        (|| self.request_once(texts))
            .retry(backoff)
            .when(EmbedError::is_retryable)
            // A server that says when to come back is believed (within reason).
            .adjust(|error, delay| match error {
                EmbedError::RateLimited {
                    retry_after: Some(after),
                } => delay.map(|_| {
                    (*after).min(
                        self.settings
                            .max_backoff
                            .max(*after)
                            .min(Duration::from_secs(60)),
                    )
                }),
                _ => delay,
            })
            .notify(
                |error, delay| tracing::warn!(%error, ?delay, "embedding request failed; retrying"),
            )
            .await
    }
}

impl Embedder for OpenAiEmbedder {
    fn model_id(&self) -> &str {
        &self.settings.model
    }

    fn dimension(&self) -> usize {
        self.settings.dimension
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> EmbedFuture<'a> {
        Box::pin(async move {
            let mut vectors = Vec::with_capacity(texts.len());
            for batch in texts.chunks(self.settings.max_batch.max(1)) {
                vectors.extend(self.request_with_retries(batch).await?);
            }
            Ok(vectors)
        })
    }
}
