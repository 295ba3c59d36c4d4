//! The ingest service's error type: each variant's gRPC code is said once, in its
//! [`ServiceError`] implementation; `engram_server::status` turns it into the client's status.

use engram_core::ValidationError;
use engram_server::status::{ServiceError, to_status};
use engram_store::StoreError;
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("invalid request: {0}")]
    Invalid(#[from] ValidationError),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// The service cannot take the request now (shutting down).
    #[error("{0}")]
    Unavailable(String),
    /// The request ran out of time before it wrote anything.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// A write's commit was sent but not confirmed: it may or may not be stored.
    #[error("the write's commit could not be confirmed")]
    CommitUnconfirmed,
    /// One failure shared by every write of a group commit.
    #[error(transparent)]
    Shared(std::sync::Arc<IngestError>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for IngestError {
    fn from(error: sqlx::Error) -> Self {
        IngestError::Store(StoreError::Database(error))
    }
}

impl From<engram_recall::RecallError> for IngestError {
    fn from(error: engram_recall::RecallError) -> Self {
        match error {
            engram_recall::RecallError::Invalid(error) => IngestError::Invalid(error),
            engram_recall::RecallError::Store(error) => IngestError::Store(error),
        }
    }
}

impl ServiceError for IngestError {
    fn code(&self) -> Code {
        match self {
            IngestError::Invalid(error) => error.code(),
            IngestError::NotFound(_) => Code::NotFound,
            IngestError::FailedPrecondition(_) => Code::FailedPrecondition,
            IngestError::Unavailable(_) => Code::Unavailable,
            IngestError::DeadlineExceeded(_) => Code::DeadlineExceeded,
            IngestError::CommitUnconfirmed => Code::Unknown,
            IngestError::Shared(error) => error.code(),
            IngestError::Store(error) => error.code(),
        }
    }

    fn client_message(&self) -> String {
        match self {
            IngestError::Invalid(error) => error.client_message(),
            IngestError::CommitUnconfirmed => "the write's commit could not be confirmed: it may \
                 have been stored; list the space's entries before writing it again"
                .to_owned(),
            IngestError::Shared(error) => error.client_message(),
            IngestError::Store(error) => error.client_message(),
            other => other.to_string(),
        }
    }

    /// The database unreachable, the service busy or shutting down, or a commit that may
    /// have failed: nothing wrong with the request.
    fn is_retryable(&self) -> bool {
        match self {
            IngestError::Store(error) => error.is_retryable(),
            IngestError::Shared(error) => error.is_retryable(),
            IngestError::Unavailable(_) | IngestError::CommitUnconfirmed => true,
            IngestError::Invalid(_)
            | IngestError::NotFound(_)
            | IngestError::FailedPrecondition(_)
            | IngestError::DeadlineExceeded(_) => false,
        }
    }
}

impl From<IngestError> for Status {
    fn from(error: IngestError) -> Self {
        to_status(&error)
    }
}
