//! Failures of a structured request, with retryability as a property of the error.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Connection refused, reset or timed out, or the answer's body could not be read.
    #[error("llm endpoint is unreachable or timed out: {0}")]
    Unavailable(String),
    #[error("llm endpoint is rate limiting (429)")]
    RateLimited { retry_after: Option<Duration> },
    #[error("llm endpoint failed with {status}")]
    Server {
        status: u16,
        /// The server's `Retry-After`, when it sent one (503 often does).
        retry_after: Option<Duration>,
    },
    /// A 4xx other than 429: the request itself is wrong (bad model, bad schema, bad key).
    #[error("llm endpoint rejected the request with {status}: {body}")]
    Rejected { status: u16, body: String },
    /// The model declined to answer.
    #[error("the model refused to answer: {0}")]
    Refused(String),
    /// The answer hit the completion token cap (`finish_reason` = "length").
    #[error("the answer was cut at the completion token cap")]
    Truncated,
    /// No answer, an answer that is not JSON, or JSON that does not fit the expected type.
    #[error("the answer is malformed: {0}")]
    Malformed(String),
    /// The response body is longer than `llm.max_response_bytes`; it was not read on.
    #[error("the answer is larger than llm.max_response_bytes ({limit_bytes} bytes)")]
    TooLarge { limit_bytes: usize },
    #[error("invalid llm configuration: {0}")]
    Config(String),
}

impl LlmError {
    /// Whether the same request may succeed later (network trouble, rate limits, server errors);
    /// the client retries these with backoff.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::Unavailable(_) | LlmError::RateLimited { .. } | LlmError::Server { .. } => {
                true
            }
            LlmError::Rejected { .. }
            | LlmError::Refused(_)
            | LlmError::Truncated
            | LlmError::Malformed(_)
            | LlmError::TooLarge { .. }
            | LlmError::Config(_) => false,
        }
    }

    /// Whether the endpoint answered, but not with a usable object; the client asks again a
    /// bounded number of times.
    pub fn is_invalid_answer(&self) -> bool {
        match self {
            LlmError::Refused(_)
            | LlmError::Truncated
            | LlmError::Malformed(_)
            | LlmError::TooLarge { .. } => true,
            LlmError::Unavailable(_)
            | LlmError::RateLimited { .. }
            | LlmError::Server { .. }
            | LlmError::Rejected { .. }
            | LlmError::Config(_) => false,
        }
    }

    /// How long the server asked us to wait, if it did.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::RateLimited { retry_after } | LlmError::Server { retry_after, .. } => {
                *retry_after
            }
            LlmError::Unavailable(_)
            | LlmError::Rejected { .. }
            | LlmError::Refused(_)
            | LlmError::Truncated
            | LlmError::Malformed(_)
            | LlmError::TooLarge { .. }
            | LlmError::Config(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_failures_are_retryable_and_answers_are_not() {
        let retryable = [
            LlmError::Unavailable("reset".into()),
            LlmError::RateLimited { retry_after: None },
            LlmError::Server {
                status: 503,
                retry_after: None,
            },
        ];
        for error in &retryable {
            assert!(error.is_retryable(), "{error}");
            assert!(!error.is_invalid_answer(), "{error}");
        }
        let invalid = [
            LlmError::Refused("no".into()),
            LlmError::Truncated,
            LlmError::Malformed("not json".into()),
            LlmError::TooLarge { limit_bytes: 1024 },
        ];
        for error in &invalid {
            assert!(!error.is_retryable(), "{error}");
            assert!(error.is_invalid_answer(), "{error}");
        }
        for error in [
            LlmError::Rejected {
                status: 400,
                body: String::new(),
            },
            LlmError::Config("no model".into()),
        ] {
            assert!(!error.is_retryable(), "{error}");
            assert!(!error.is_invalid_answer(), "{error}");
        }
    }
}
