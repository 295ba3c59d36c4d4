//! Failures of a retrieval that the caller must see (the embedder failing is not one: retrieval
//! falls back to the sparse leg and says so).

use engram_core::ValidationError;
use engram_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum RecallError {
    #[error("invalid request: {0}")]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    Store(#[from] StoreError),
}
