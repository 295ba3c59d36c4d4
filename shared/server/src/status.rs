//! How store failures reach clients: retryable ones as Unavailable (clients may retry), the rest
//! as an opaque Internal. The cause goes to the log, never to the client.

use engram_store::StoreError;
use tonic::Status;

pub fn from_store_error(error: &StoreError) -> Status {
    tracing::error!(error = %error, retryable = error.is_retryable(), "store operation failed");
    if error.is_retryable() {
        Status::unavailable("the memory store is temporarily unavailable; retry")
    } else {
        Status::internal("internal error")
    }
}
