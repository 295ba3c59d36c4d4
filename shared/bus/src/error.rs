//! Bus failures. All of them are worth retrying after a reconnect except a broker's nack of a
//! publish, which says the broker could not take the message.

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("broker error: {0}")]
    Broker(#[from] lapin::Error),
    #[error("the broker refused (nacked) the message")]
    Nacked,
}

impl BusError {
    pub fn is_retryable(&self) -> bool {
        match self {
            BusError::Broker(_) | BusError::Nacked => true,
        }
    }
}
