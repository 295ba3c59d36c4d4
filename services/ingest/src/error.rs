//! The ingest service's error type, mapped to gRPC statuses at the edge. Internal failures reach
//! the client as an opaque message; the cause goes to the log.

use engram_core::ValidationError;
use engram_store::StoreError;
use tonic::Status;

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

impl IngestError {
    /// Whether trying again later may succeed: the database unreachable or the service busy,
    /// nothing wrong with the request.
    pub fn is_retryable(&self) -> bool {
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

impl From<IngestError> for Status {
    fn from(error: IngestError) -> Self {
        Status::from(&error)
    }
}

impl From<&IngestError> for Status {
    fn from(error: &IngestError) -> Self {
        match error {
            IngestError::Invalid(error) => Status::invalid_argument(error.to_string()),
            IngestError::NotFound(message) => Status::not_found(message.clone()),
            IngestError::FailedPrecondition(message) => {
                Status::failed_precondition(message.clone())
            }
            IngestError::Unavailable(message) => Status::unavailable(message.clone()),
            IngestError::DeadlineExceeded(message) => Status::deadline_exceeded(message.clone()),
            IngestError::CommitUnconfirmed => Status::unknown(
                "the write's commit could not be confirmed: it may have been stored; \
                 list the space's entries before writing it again",
            ),
            IngestError::Shared(error) => Status::from(error.as_ref()),
            IngestError::Store(error) => engram_server::status::from_store_error(error),
        }
    }
}
