//! How a service's failures reach clients, in one place. Every service error names its gRPC code
//! through [`ServiceError`]; [`to_status`] turns it into the status clients see. Failures of the
//! server itself (the store, an internal fault) reach clients as an opaque message, retryable ones
//! as Unavailable; the cause goes to the log, never to the client.

use engram_core::ValidationError;
use engram_store::StoreError;
use tonic::{Code, Status};

/// What the gRPC edge needs of a service's error. A new error variant says here which code it
/// is; every service maps its errors with [`to_status`].
pub trait ServiceError: std::error::Error {
    /// The gRPC code clients see.
    fn code(&self) -> Code;

    /// What clients read. Only errors about the request itself explain themselves; the server's
    /// own failures (Internal, Unknown, a store failure) keep their cause in the log.
    fn client_message(&self) -> String {
        self.to_string()
    }

    /// Whether trying again later may succeed: the database or a dependency unreachable or
    /// busy, nothing wrong with the request. Bus consumers use it to requeue or give up.
    fn is_retryable(&self) -> bool {
        self.code() == Code::Unavailable
    }
}

/// The one mapping from a service error to the status its client sees. Server-side failures are
/// logged here, once, with their cause.
pub fn to_status(error: &(impl ServiceError + ?Sized)) -> Status {
    let code = error.code();
    match code {
        Code::Internal | Code::Unknown => {
            tracing::error!(error = %error, retryable = error.is_retryable(), "request failed");
        }
        // A dependency away or the service shutting down: clients retry, the log notes it.
        Code::Unavailable => tracing::warn!(error = %error, "request failed; retryable"),
        _ => {}
    }
    Status::new(code, error.client_message())
}

impl ServiceError for ValidationError {
    fn code(&self) -> Code {
        Code::InvalidArgument
    }

    fn client_message(&self) -> String {
        format!("invalid request: {self}")
    }
}

impl ServiceError for StoreError {
    fn code(&self) -> Code {
        if StoreError::is_retryable(self) {
            Code::Unavailable
        } else {
            Code::Internal
        }
    }

    fn client_message(&self) -> String {
        if StoreError::is_retryable(self) {
            "the memory store is temporarily unavailable; retry".to_owned()
        } else {
            "internal error".to_owned()
        }
    }

    fn is_retryable(&self) -> bool {
        StoreError::is_retryable(self)
    }
}

/// gRPC specifies RESOURCE_EXHAUSTED for a request larger than the server accepts; tonic answers
/// OUT_OF_RANGE. Engram's handlers never answer OUT_OF_RANGE themselves, so on a response that
/// carries it (a trailers-only response: the request was refused before any handler ran) the
/// code is corrected, and clients see the status the spec and their retry policies expect.
pub fn oversized_request_as_resource_exhausted<B>(
    mut response: http::Response<B>,
) -> http::Response<B> {
    const GRPC_STATUS: &str = "grpc-status";
    let out_of_range = (tonic::Code::OutOfRange as i32).to_string();
    if response
        .headers()
        .get(GRPC_STATUS)
        .is_some_and(|code| code.as_bytes() == out_of_range.as_bytes())
    {
        let resource_exhausted = (tonic::Code::ResourceExhausted as i32).to_string();
        response.headers_mut().insert(
            GRPC_STATUS,
            http::HeaderValue::from_str(&resource_exhausted).expect("a number is a header value"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_status(code: &str) -> http::Response<()> {
        http::Response::builder()
            .header("grpc-status", code)
            .body(())
            .unwrap()
    }

    #[test]
    fn a_request_error_explains_itself_and_a_server_failure_does_not() {
        let invalid = to_status(&ValidationError::new("memory_id", "is required"));
        assert_eq!(invalid.code(), Code::InvalidArgument);
        assert_eq!(invalid.message(), "invalid request: memory_id: is required");

        let corrupt = to_status(&StoreError::Corrupt("row 7 has no text".into()));
        assert_eq!(corrupt.code(), Code::Internal);
        assert_eq!(
            corrupt.message(),
            "internal error",
            "the cause stays in the log"
        );

        let unreachable = to_status(&StoreError::Database(sqlx::Error::PoolTimedOut));
        assert_eq!(unreachable.code(), Code::Unavailable);
        assert!(ServiceError::is_retryable(&StoreError::Database(
            sqlx::Error::PoolTimedOut
        )));
        assert!(unreachable.message().ends_with("retry"));
    }

    #[test]
    fn only_out_of_range_becomes_resource_exhausted() {
        let corrected = oversized_request_as_resource_exhausted(with_status("11"));
        assert_eq!(corrected.headers()["grpc-status"], "8");
        let untouched = oversized_request_as_resource_exhausted(with_status("3"));
        assert_eq!(untouched.headers()["grpc-status"], "3");
        let ok = oversized_request_as_resource_exhausted(http::Response::new(()));
        assert!(ok.headers().get("grpc-status").is_none());
    }
}
