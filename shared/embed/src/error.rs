//! Embedding failures, with retryability as a property of the error.

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("cannot load the embedding model from {path}: {reason}")]
    Load { path: String, reason: String },
    #[error("embedding inference failed: {0}")]
    Inference(String),
    #[error("embedding endpoint is unreachable or timed out: {0}")]
    Unreachable(String),
    #[error("embedding endpoint is rate limiting (429)")]
    RateLimited {
        retry_after: Option<std::time::Duration>,
    },
    #[error("embedding endpoint answered {status}: {body}")]
    Http { status: u16, body: String },
    #[error("embedding endpoint answered something unexpected: {0}")]
    BadResponse(String),
    #[error("expected embeddings of dimension {expected}, got {actual}")]
    Dimension { expected: usize, actual: usize },
}

impl EmbedError {
    /// Whether the same request may succeed later (network trouble, rate limits, server errors).
    pub fn is_retryable(&self) -> bool {
        match self {
            EmbedError::Unreachable(_) | EmbedError::RateLimited { .. } => true,
            EmbedError::Http { status, .. } => *status >= 500 || *status == 408,
            EmbedError::Load { .. }
            | EmbedError::Inference(_)
            | EmbedError::BadResponse(_)
            | EmbedError::Dimension { .. } => false,
        }
    }
}
