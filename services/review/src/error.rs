//! The review service's error type: each variant's gRPC code is said once, in its
//! [`ServiceError`] implementation; `engram_server::status` turns it into the client's status.

use engram_core::ValidationError;
use engram_server::status::{ServiceError, to_status};
use engram_store::StoreError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("invalid request: {0}")]
    Invalid(#[from] ValidationError),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The LLM could not grade and the review was not to fall back to the local grader.
    #[error("the LLM could not grade: {0}")]
    Llm(#[from] engram_llm::LlmError),
}

impl ServiceError for ReviewError {
    fn code(&self) -> Code {
        match self {
            ReviewError::Invalid(error) => error.code(),
            ReviewError::NotFound(_) => Code::NotFound,
            ReviewError::FailedPrecondition(_) => Code::FailedPrecondition,
            ReviewError::Store(error) => error.code(),
            ReviewError::Llm(_) => Code::Unavailable,
        }
    }

    fn client_message(&self) -> String {
        match self {
            ReviewError::Invalid(error) => error.client_message(),
            ReviewError::Store(error) => error.client_message(),
            other => other.to_string(),
        }
    }

    /// An LLM answer that is malformed, refused, cut or too large is not retryable although
    /// clients see Unavailable: at temperature 0 it would come again.
    fn is_retryable(&self) -> bool {
        match self {
            ReviewError::Store(error) => error.is_retryable(),
            ReviewError::Llm(error) => error.is_retryable(),
            ReviewError::Invalid(_)
            | ReviewError::NotFound(_)
            | ReviewError::FailedPrecondition(_) => false,
        }
    }
}

impl From<ReviewError> for Status {
    fn from(error: ReviewError) -> Self {
        to_status(&error)
    }
}
