//! The retrieval service's error type, mapped to gRPC statuses at the edge.

use engram_core::ValidationError;
use engram_recall::RecallError;
use engram_store::StoreError;
use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum RetrievalError {
    #[error("invalid request: {0}")]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<RecallError> for RetrievalError {
    fn from(error: RecallError) -> Self {
        match error {
            RecallError::Invalid(error) => RetrievalError::Invalid(error),
            RecallError::Store(error) => RetrievalError::Store(error),
        }
    }
}

impl From<RetrievalError> for Status {
    fn from(error: RetrievalError) -> Self {
        match error {
            RetrievalError::Invalid(error) => Status::invalid_argument(error.to_string()),
            RetrievalError::Store(error) => engram_server::status::from_store_error(&error),
        }
    }
}
