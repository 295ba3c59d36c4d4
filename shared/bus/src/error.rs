//! Bus failures. Callers treat every one the same way: reconnect with backoff and try again
//! (events wait in the outbox, messages in their queue).

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("broker error: {0}")]
    Broker(#[from] lapin::Error),
    #[error("the broker refused (nacked) the message")]
    Nacked,
    #[error("cannot read the broker's CA from {path}: {reason}")]
    Ca { path: String, reason: String },
}
