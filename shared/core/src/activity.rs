//! How busy a service's request path is, for background work that should wait for a quiet
//! moment instead of competing with requests for the cores.
//!
//! The gRPC server counts the requests it is serving ([`RequestActivity::begin`] when one comes
//! in; the guard is dropped with its answer). Background work asks [`RequestActivity::quiet_for`]:
//! how long no request has been in flight. The ingest service's embedding backfill uses it to run
//! the local model in the gaps between requests (shared/embed/src/inference.rs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The requests a service is serving, and when the last one began or ended.
#[derive(Debug)]
pub struct RequestActivity {
    origin: Instant,
    in_flight: AtomicUsize,
    /// When a request last began or ended, in microseconds since `origin`.
    last_change_micros: AtomicU64,
}

impl Default for RequestActivity {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestActivity {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_change_micros: AtomicU64::new(0),
        }
    }

    /// Counts a request until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> RequestGuard {
        self.stamp();
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        RequestGuard {
            activity: self.clone(),
        }
    }

    /// Requests being served right now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// How long no request has been in flight; `None` while one is.
    pub fn quiet_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = self.last_change_micros.load(Ordering::Acquire);
        Some(Duration::from_micros(
            self.now_micros().saturating_sub(last),
        ))
    }

    fn now_micros(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn stamp(&self) {
        self.last_change_micros
            .fetch_max(self.now_micros(), Ordering::AcqRel);
    }
}

/// One request being served; dropping it ends the request.
#[derive(Debug)]
pub struct RequestGuard {
    activity: Arc<RequestActivity>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        // The time first: whoever then sees no request in flight also sees when the last ended.
        self.activity.stamp();
        self.activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_in_flight_means_no_quiet_and_its_end_starts_the_quiet() {
        let activity = Arc::new(RequestActivity::new());
        assert!(activity.quiet_for().is_some());
        let first = activity.begin();
        let second = activity.begin();
        assert_eq!(activity.in_flight(), 2);
        assert_eq!(activity.quiet_for(), None);
        drop(first);
        assert_eq!(activity.quiet_for(), None, "one request is still in flight");
        drop(second);
        let quiet = activity.quiet_for().expect("no request in flight");
        assert!(quiet < Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(20));
        assert!(activity.quiet_for().unwrap() >= Duration::from_millis(20));
    }
}
