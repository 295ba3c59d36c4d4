//! Counts the requests a service is serving ([`engram_core::activity::RequestActivity`]), so
//! that background work can wait for the gaps between them.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use engram_core::activity::RequestActivity;
use tower::{Layer, Service};

/// Tower layer that counts each request from its arrival to its answer.
#[derive(Debug, Clone)]
pub struct RequestActivityLayer {
    activity: Arc<RequestActivity>,
}

impl RequestActivityLayer {
    pub fn new(activity: Arc<RequestActivity>) -> Self {
        Self { activity }
    }
}

impl<S> Layer<S> for RequestActivityLayer {
    type Service = CountRequests<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CountRequests {
            inner,
            activity: self.activity.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct CountRequests<S> {
    inner: S,
    activity: Arc<RequestActivity>,
}

impl<S, Request> Service<Request> for CountRequests<S>
where
    S: Service<Request>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let request_in_flight = self.activity.begin();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await;
            drop(request_in_flight);
            response
        })
    }
}
