//! The store's error type. Retryability is a property of the error, so callers can decide to
//! retry, requeue or give up without inspecting SQL states themselves.

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    #[error("stored row is corrupt: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Whether the same operation may succeed if tried again (lost connection, pool exhausted,
    /// the server shutting down or starting, serialization failure or deadlock).
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Database(
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed,
            ) => true,
            StoreError::Database(sqlx::Error::Database(error)) => {
                error.code().as_deref().is_some_and(|code| {
                    // Connection exceptions (08), insufficient resources (53), the server
                    // shutting down or starting (57P), serialization failures and deadlocks, a
                    // lock not granted in time, a read-only server during a failover.
                    code.starts_with("08")
                        || code.starts_with("53")
                        || code.starts_with("57P")
                        || matches!(code, "40001" | "40P01" | "55P03" | "25006")
                })
            }
            StoreError::Database(_) | StoreError::Migration(_) | StoreError::Corrupt(_) => false,
        }
    }
}
