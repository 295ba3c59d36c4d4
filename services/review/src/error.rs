//! The review service's error type, mapped to gRPC statuses at the edge.

use engram_core::ValidationError;
use engram_store::StoreError;
use tonic::Status;

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

impl ReviewError {
    /// Whether trying again later may succeed: the database or the LLM unreachable or busy,
    /// nothing wrong with the request. An LLM answer that is malformed, refused, cut or too
    /// large is not: at temperature 0 it would come again.
    pub fn is_retryable(&self) -> bool {
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
        match error {
            ReviewError::Invalid(error) => Status::invalid_argument(error.to_string()),
            ReviewError::NotFound(message) => Status::not_found(message),
            ReviewError::FailedPrecondition(message) => Status::failed_precondition(message),
            ReviewError::Store(error) => engram_server::status::from_store_error(&error),
            ReviewError::Llm(error) => {
                Status::unavailable(format!("the LLM could not grade: {error}"))
            }
        }
    }
}
