//! The retrieval service's error type: each variant's gRPC code is said once, in its
//! [`ServiceError`] implementation; `engram_server::status` turns it into the client's status.

use engram_core::ValidationError;
use engram_recall::RecallError;
use engram_server::status::{ServiceError, to_status};
use engram_store::StoreError;
use tonic::{Code, Status};

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

impl ServiceError for RetrievalError {
    fn code(&self) -> Code {
        match self {
            RetrievalError::Invalid(error) => error.code(),
            RetrievalError::Store(error) => error.code(),
        }
    }

    fn client_message(&self) -> String {
        match self {
            RetrievalError::Invalid(error) => error.client_message(),
            RetrievalError::Store(error) => error.client_message(),
        }
    }

    fn is_retryable(&self) -> bool {
        matches!(self, RetrievalError::Store(error) if error.is_retryable())
    }
}

impl From<RetrievalError> for Status {
    fn from(error: RetrievalError) -> Self {
        to_status(&error)
    }
}
