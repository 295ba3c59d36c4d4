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
    fn only_out_of_range_becomes_resource_exhausted() {
        let corrected = oversized_request_as_resource_exhausted(with_status("11"));
        assert_eq!(corrected.headers()["grpc-status"], "8");
        let untouched = oversized_request_as_resource_exhausted(with_status("3"));
        assert_eq!(untouched.headers()["grpc-status"], "3");
        let ok = oversized_request_as_resource_exhausted(http::Response::new(()));
        assert!(ok.headers().get("grpc-status").is_none());
    }
}
