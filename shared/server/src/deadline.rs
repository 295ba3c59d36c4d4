//! Request deadlines, answered with the status that tells a caller what happened.
//!
//! A request ends at the earlier of the caller's `grpc-timeout` and the server's own limit
//! (`grpc.request_timeout_secs`). tonic's own timeout answers CANCELLED ("Timeout expired"), which
//! reads as "the caller gave up" and says nothing about a write. Here a request past its deadline
//! gets:
//! - DEADLINE_EXCEEDED when nothing it asked for was written (a read, or a write that had not
//!   reached its commit: it is abandoned, and the group commit skips writes whose caller left);
//! - UNKNOWN when its write had reached its commit: it may have been applied, so the caller
//!   should read it back before retrying (the code gRPC gives to outcomes the server cannot know).
//!
//! Writers say when a write reaches its commit through [`WriteMark`]: the layer puts one in scope
//! for each request (a task-local), and the code about to commit sets it ([`mark_write_started`],
//! or a mark carried to another task with [`WriteMark::current`]).
//!
//! The layer answers a few milliseconds before the caller's deadline, so its status arrives while
//! the caller still listens (tonic's own timer, still run for `grpc-timeout`, would answer
//! CANCELLED at the deadline itself).
//!
//! What a client may assume, and what makes it true:
//! - DEADLINE_EXCEEDED from Engram (its message says "nothing it asked to write was written"):
//!   nothing was written. The request was abandoned before its commit was sent (or a statement
//!   that commits as it ends gave up waiting for a lock), and nothing of it runs afterwards: a
//!   transaction begun for it is rolled back, never handed on (`engram_store::begin`).
//! - UNKNOWN: the commit had been sent; the write may have landed. Read it back, or repeat it
//!   where repeating is safe (AppendMessages with `client_message_id`, ImportMemories with
//!   `client_id`).
//! - A deadline the client's own library reports (no message from Engram): the server's answer
//!   did not arrive in time, so the outcome is unknown, as for UNKNOWN. This is what a client
//!   sees when its deadline is shorter than the network and scheduling delays around the server,
//!   or the server's host is overloaded; give writes deadlines of at least a few hundred
//!   milliseconds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::Status;
use tower::{Layer, Service};

/// How much earlier than the caller's deadline the server answers. tonic's own `grpc-timeout`
/// handling cancels the call at the deadline itself (CANCELLED, "Timeout expired"); with 5 ms
/// ahead, a loaded machine sometimes let that win (the full test suite on two cores did), and
/// the caller got CANCELLED instead of this layer's precise answer.
const ANSWER_AHEAD_OF_CALLER: Duration = Duration::from_millis(25);

tokio::task_local! {
    static CURRENT_WRITE: WriteMark;
}

/// Set once the request's write has reached its commit (it may land from then on, whatever
/// happens to the request); it also knows when the request's time is up.
#[derive(Debug, Clone, Default)]
pub struct WriteMark {
    reached_commit: Arc<AtomicBool>,
    deadline: Option<tokio::time::Instant>,
}

impl WriteMark {
    fn until(deadline: tokio::time::Instant) -> Self {
        Self {
            reached_commit: Arc::default(),
            deadline: Some(deadline),
        }
    }

    /// The mark of the request being served, to carry to a task that writes on its behalf.
    pub fn current() -> Option<Self> {
        CURRENT_WRITE.try_with(Clone::clone).ok()
    }

    pub fn set(&self) {
        self.reached_commit.store(true, Ordering::SeqCst);
    }

    pub fn is_set(&self) -> bool {
        self.reached_commit.load(Ordering::SeqCst)
    }
}

/// Marks the current request's write as reaching its commit; nothing outside a request.
pub fn mark_write_started() {
    let _ = CURRENT_WRITE.try_with(WriteMark::set);
}

/// How long the current request has until this layer answers it; `None` outside a request. A
/// write whose statement also commits (one round trip) bounds its lock waits by this, so that a
/// write stuck behind a lock fails with nothing written, rather than outliving its request.
pub fn time_left() -> Option<Duration> {
    CURRENT_WRITE
        .try_with(|mark| mark.deadline)
        .ok()
        .flatten()
        .map(|deadline| deadline.saturating_duration_since(tokio::time::Instant::now()))
}

/// Parses a `grpc-timeout` value: up to 8 digits and a unit (H, M, S, m, u, n).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3_600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// How long a request may run: the caller's deadline (a little ahead of it) or the server's.
fn time_allowed(headers: &http::HeaderMap, server_limit: Duration) -> Duration {
    headers
        .get("grpc-timeout")
        .and_then(|value| value.to_str().ok())
        .and_then(parse_grpc_timeout)
        .map(|caller| caller.saturating_sub(ANSWER_AHEAD_OF_CALLER))
        .map_or(server_limit, |caller| caller.min(server_limit))
}

fn past_deadline(allowed: Duration, write: &WriteMark) -> Status {
    let millis = allowed.as_millis();
    if write.is_set() {
        Status::unknown(format!(
            "the request ran past its deadline ({millis} ms) while its write was being committed: \
             it may or may not have been applied; read it back before retrying"
        ))
    } else {
        Status::deadline_exceeded(format!(
            "the request did not finish within its deadline ({millis} ms); nothing it asked to \
             write was written"
        ))
    }
}

/// Tower layer enforcing request deadlines (see the module documentation).
#[derive(Debug, Clone)]
pub struct DeadlineLayer {
    server_limit: Duration,
}

impl DeadlineLayer {
    pub fn new(server_limit: Duration) -> Self {
        Self { server_limit }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService {
            inner,
            server_limit: self.server_limit,
        }
    }
}

#[derive(Debug, Clone)]
pub struct DeadlineService<S> {
    inner: S,
    server_limit: Duration,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for DeadlineService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let allowed = time_allowed(request.headers(), self.server_limit);
        let write = WriteMark::until(tokio::time::Instant::now() + allowed);
        let served = CURRENT_WRITE.scope(write.clone(), self.inner.call(request));
        Box::pin(async move {
            match tokio::time::timeout(allowed, served).await {
                Ok(response) => response,
                // The handler was dropped above; whether its write had reached its commit is
                // settled by now.
                Err(_) => Ok(past_deadline(allowed, &write).into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("30S"), Some(Duration::from_secs(30)));
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(
            parse_grpc_timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_grpc_timeout("5n"), Some(Duration::from_nanos(5)));
        for bad in ["", "S", "10", "10s", "123456789S", "-1S", "1.5S", "10 S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_earlier_deadline_applies_a_little_ahead_of_the_caller() {
        let limit = Duration::from_secs(30);
        let mut headers = http::HeaderMap::new();
        assert_eq!(time_allowed(&headers, limit), limit);
        headers.insert("grpc-timeout", http::HeaderValue::from_static("200m"));
        assert_eq!(time_allowed(&headers, limit), Duration::from_millis(175));
        headers.insert("grpc-timeout", http::HeaderValue::from_static("1H"));
        assert_eq!(time_allowed(&headers, limit), limit);
        headers.insert("grpc-timeout", http::HeaderValue::from_static("garbage"));
        assert_eq!(time_allowed(&headers, limit), limit);
    }

    #[tokio::test]
    async fn a_write_that_reached_its_commit_is_unknown_past_the_deadline() {
        let write = WriteMark::default();
        assert!(WriteMark::current().is_none(), "no request, no mark");
        mark_write_started();
        CURRENT_WRITE
            .scope(write.clone(), async {
                let carried = WriteMark::current().expect("in scope");
                assert!(!carried.is_set());
                mark_write_started();
            })
            .await;
        assert!(write.is_set());
        let allowed = Duration::from_millis(10);
        assert_eq!(past_deadline(allowed, &write).code(), tonic::Code::Unknown);
        assert_eq!(
            past_deadline(allowed, &WriteMark::default()).code(),
            tonic::Code::DeadlineExceeded
        );
    }
}
