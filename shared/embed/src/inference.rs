//! The threads the local model runs on.
//!
//! Inference is CPU work of milliseconds to seconds a batch, so it never runs on the async
//! workers. It runs on a few dedicated threads instead of tokio's blocking pool, for two reasons:
//! the number of inference calls under way is bounded by the cores (more would only fight over
//! them), and the threads can run at a lower priority. Ingest and review embed in the background
//! (backfill, segmentation, grading) beside requests that must answer in milliseconds: at a nice
//! value of 10 the kernel gives a runnable request thread about nine times the share of a
//! model thread, so a busy model delays an AppendMessages by little instead of by half the
//! machine. candle's own worker threads are created by the first inference, on one of these
//! threads, and inherit its nice value (Linux keeps it per thread and copies it to new threads).
//!
//! Jobs come in two lanes. Background jobs (the backfill's batches of episodes and facts, a
//! second or more each on a small host) run in arrival order; an urgent job (a few new tokens'
//! vectors that segmentation waits for) goes before every waiting background job, and one extra
//! thread takes only urgent jobs, so that it never waits for a background batch to finish.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use engram_core::activity::RequestActivity;

use crate::{EmbedError, EmbedFuture};

/// Work that no request waits for runs the model only in the gaps between the service's
/// requests: each forward pass of it starts once no request has been in flight for `quiet`
/// (or at its caller's latest start, whichever comes first).
///
/// Why a nice value is not enough: on a small host the model competes with the request path for
/// more than CPU time. With the model's threads at the kernel's lowest priority (SCHED_IDLE,
/// tried by hand) an append's p99 still rose from 10 to 37 ms at 200 appends a second beside
/// a busy model (docs/benchmarks/README.md): a pass, once on a core, keeps it and the caches
/// until the scheduler's next look, and its memory traffic slows whatever shares the machine.
/// A pass that only starts in a quiet moment meets few requests. The cost: under a load with
/// no quiet moment the backfill waits (new entries are found by their words meanwhile, and
/// the backfill's latest start bounds how long an entry waits for its vector).
#[derive(Debug, Clone)]
pub struct YieldToRequests {
    /// The service's requests in flight (its gRPC server counts them).
    pub activity: Arc<RequestActivity>,
    /// How long no request must have been in flight before a pass starts.
    pub quiet: Duration,
}

impl YieldToRequests {
    /// Blocks the calling (model) thread until a quiet moment or `not_after`.
    fn wait(&self, not_after: Instant) {
        // Checked often enough to catch a gap, rarely enough to cost nothing.
        let poll = (self.quiet / 4).clamp(Duration::from_millis(1), Duration::from_millis(10));
        loop {
            if self
                .activity
                .quiet_for()
                .is_some_and(|quiet| quiet >= self.quiet)
            {
                return;
            }
            let now = Instant::now();
            if now >= not_after {
                return;
            }
            std::thread::sleep(poll.min(not_after - now));
        }
    }
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Which queue a job waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Small jobs something waits for right now: before every background job, and on a thread
    /// of their own.
    Urgent,
    /// Batches nobody waits for to answer a request (the backfill).
    Background,
}

#[derive(Default)]
struct Queues {
    urgent: VecDeque<Job>,
    background: VecDeque<Job>,
    closed: bool,
}

struct Shared {
    queues: Mutex<Queues>,
    ready: Condvar,
}

impl Shared {
    /// The next job a thread may take (urgent first; background only on a general thread), or
    /// `None` once closed and drained of what the thread may take.
    fn next(&self, takes_background: bool) -> Option<Job> {
        let mut queues = self.queues.lock().ok()?;
        loop {
            if let Some(job) = queues.urgent.pop_front() {
                return Some(job);
            }
            if takes_background && let Some(job) = queues.background.pop_front() {
                return Some(job);
            }
            if queues.closed {
                return None;
            }
            queues = self.ready.wait(queues).ok()?;
        }
    }
}

/// A fixed set of threads, at one nice value, that run inference jobs: urgent ones first, each
/// lane in arrival order.
pub(crate) struct InferenceThreads {
    shared: Arc<Shared>,
    nice: i32,
    yielding: Option<YieldToRequests>,
}

impl Drop for InferenceThreads {
    fn drop(&mut self) {
        // Every embedder is gone: the threads finish what is queued and end.
        if let Ok(mut queues) = self.shared.queues.lock() {
            queues.closed = true;
        }
        self.shared.ready.notify_all();
    }
}

impl std::fmt::Debug for InferenceThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InferenceThreads")
            .field("nice", &self.nice)
            .finish_non_exhaustive()
    }
}

impl InferenceThreads {
    /// Starts `threads` general threads (at least one) and one for urgent jobs only, at `nice`
    /// (0: the process's own priority). A nice value the process may not take (a negative one
    /// without CAP_SYS_NICE) is logged and the threads run at the process's priority.
    pub(crate) fn start(
        threads: usize,
        nice: i32,
        yielding: Option<YieldToRequests>,
    ) -> Result<Arc<Self>, EmbedError> {
        let shared = Arc::new(Shared {
            queues: Mutex::new(Queues::default()),
            ready: Condvar::new(),
        });
        let general = threads.max(1);
        for index in 0..=general {
            let shared = shared.clone();
            let takes_background = index < general;
            let name = if takes_background {
                format!("engram-model-{index}")
            } else {
                "engram-model-urgent".to_owned()
            };
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    lower_priority(nice);
                    while let Some(job) = shared.next(takes_background) {
                        // A panicking job loses its answer (its caller gets an error), not the
                        // thread.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .map_err(|error| {
                    EmbedError::Inference(format!("cannot start a model thread: {error}"))
                })?;
        }
        Ok(Arc::new(Self {
            shared,
            nice,
            yielding,
        }))
    }

    /// Queues a job in its lane for the next free model thread.
    fn submit(&self, lane: Lane, job: Job) -> Result<(), EmbedError> {
        let mut queues = self
            .shared
            .queues
            .lock()
            .map_err(|_| EmbedError::Inference("the model threads have stopped".into()))?;
        match lane {
            Lane::Urgent => queues.urgent.push_back(job),
            Lane::Background => queues.background.push_back(job),
        }
        drop(queues);
        // Every waiting thread: only some of them may take a background job.
        self.shared.ready.notify_all();
        Ok(())
    }

    /// Runs `work` on a model thread and waits for it without blocking the async runtime.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        lane: Lane,
        work: impl FnOnce() -> Result<T, EmbedError> + Send + 'static,
    ) -> Result<T, EmbedError> {
        let (done, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // The caller may have given up waiting (a timeout); its answer is then dropped.
            let _ = done.send(work());
        });
        self.submit(lane, job)?;
        result
            .await
            .map_err(|_| EmbedError::Inference("an inference job panicked".into()))?
    }

    /// An embedder's `embed`: `embed_texts` over a copy of `texts` on a model thread (the local
    /// model and the token vectors built on it share these threads).
    pub(crate) fn embed<'a>(
        &'a self,
        lane: Lane,
        texts: &[String],
        embed_texts: impl FnOnce(&[String]) -> Result<Vec<Vec<f32>>, EmbedError> + Send + 'static,
    ) -> EmbedFuture<'a> {
        let texts = texts.to_vec();
        Box::pin(self.run(lane, move || embed_texts(&texts)))
    }

    /// Runs `work` on a model thread and blocks the calling (non-async) thread until it is done.
    pub(crate) fn run_blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, EmbedError> + Send + 'static,
    ) -> Result<T, EmbedError> {
        let (done, result) = mpsc::channel();
        let job: Job = Box::new(move || {
            let _ = done.send(work());
        });
        self.submit(Lane::Urgent, job)?;
        result
            .recv()
            .map_err(|_| EmbedError::Inference("an inference job panicked".into()))?
    }

    pub(crate) fn nice(&self) -> i32 {
        self.nice
    }

    /// Called on a model thread before a forward pass of work no request waits for: waits for
    /// a gap between requests when the threads yield to them, up to `not_after`.
    pub(crate) fn wait_for_quiet(&self, not_after: Instant) {
        if let Some(yielding) = &self.yielding {
            yielding.wait(not_after);
        }
    }
}

/// Sets the calling thread's nice value (on Linux a per-thread value: `setpriority` on the
/// process id 0 means the calling thread).
fn lower_priority(nice: i32) {
    if nice == 0 {
        return;
    }
    if let Err(error) = rustix::process::setpriority_process(None, nice) {
        tracing::warn!(nice, %error, "cannot set the model threads' nice value; they run at the process's priority");
    }
}

/// The current thread's nice value.
#[cfg(test)]
fn current_thread_nice() -> Option<i32> {
    rustix::process::getpriority_process(None).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_threads_at_the_asked_nice_value() {
        let threads = InferenceThreads::start(2, 7, None).unwrap();
        let before = current_thread_nice().unwrap();
        let nice = threads
            .run(Lane::Background, || Ok(current_thread_nice()))
            .await
            .unwrap();
        assert_eq!(nice, Some((before + 7).min(19)));
        let name = threads
            .run(Lane::Background, || {
                Ok(std::thread::current().name().map(str::to_owned))
            })
            .await
            .unwrap();
        assert!(name.unwrap().starts_with("engram-model-"));
        // The caller's own priority is untouched.
        assert_eq!(current_thread_nice().unwrap(), before);
    }

    #[tokio::test]
    async fn threads_spawned_by_a_job_inherit_its_nice_value() {
        let threads = InferenceThreads::start(1, 5, None).unwrap();
        let before = current_thread_nice().unwrap();
        let inherited = threads
            .run(Lane::Background, || {
                Ok(std::thread::spawn(current_thread_nice)
                    .join()
                    .expect("the child thread ran"))
            })
            .await
            .unwrap();
        assert_eq!(inherited, Some((before + 5).min(19)));
    }

    /// A long background batch holds the only general thread; an urgent job still runs at
    /// once, on the urgent thread, and goes before background jobs already waiting.
    #[tokio::test]
    async fn urgent_jobs_do_not_wait_for_background_batches() {
        let threads = InferenceThreads::start(1, 0, None).unwrap();
        let (release, held) = mpsc::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let order = Arc::new(Mutex::new(Vec::new()));
        let batch = threads.run(Lane::Background, move || {
            let _ = started.send(());
            held.recv().ok();
            Ok("batch")
        });
        let waiting = {
            let order = order.clone();
            threads.run(Lane::Background, move || {
                order.lock().unwrap().push("background");
                Ok(())
            })
        };
        let (batch, waiting, urgent) = tokio::join!(batch, waiting, async {
            running.await.unwrap();
            let urgent = threads
                .run(Lane::Urgent, {
                    let order = order.clone();
                    move || {
                        order.lock().unwrap().push("urgent");
                        Ok(std::thread::current().name().map(str::to_owned))
                    }
                })
                .await;
            // Only now let the batch finish.
            release.send(()).unwrap();
            urgent
        });
        assert_eq!(batch.unwrap(), "batch");
        waiting.unwrap();
        assert_eq!(urgent.unwrap().as_deref(), Some("engram-model-urgent"));
        assert_eq!(*order.lock().unwrap(), vec!["urgent", "background"]);
    }

    #[tokio::test]
    async fn a_failing_job_is_an_error_and_the_threads_go_on() {
        let threads = InferenceThreads::start(1, 0, None).unwrap();
        let failed = threads
            .run(Lane::Background, || -> Result<(), EmbedError> {
                Err(EmbedError::Inference("bad".into()))
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(threads.run(Lane::Background, || Ok(1)).await.unwrap(), 1);
        assert_eq!(threads.run_blocking(|| Ok(2)).unwrap(), 2);
    }

    /// Work run between requests starts once no request has been in flight for the quiet
    /// period; under requests that never pause, at its latest start.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_between_requests_waits_for_a_quiet_moment_or_its_latest_start() {
        let activity = Arc::new(RequestActivity::new());
        let quiet = Duration::from_millis(30);
        let threads = InferenceThreads::start(
            1,
            0,
            Some(YieldToRequests {
                activity: activity.clone(),
                quiet,
            }),
        )
        .unwrap();
        let pass_at = |latest: Instant| {
            let threads = threads.clone();
            let job_threads = threads.clone();
            tokio::spawn(async move {
                threads
                    .run(Lane::Background, move || {
                        job_threads.wait_for_quiet(latest);
                        Ok(Instant::now())
                    })
                    .await
                    .unwrap()
            })
        };

        let request = activity.begin();
        let pass = pass_at(Instant::now() + Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!pass.is_finished(), "the pass started during a request");
        let request_ended = Instant::now();
        drop(request);
        assert!(pass.await.unwrap() >= request_ended + quiet);

        let _never_ending = activity.begin();
        let latest = Instant::now() + Duration::from_millis(80);
        assert!(pass_at(latest).await.unwrap() >= latest);

        // Without a policy nothing waits, requests or not.
        let plain = InferenceThreads::start(1, 0, None).unwrap();
        let job_threads = plain.clone();
        let far = Instant::now() + Duration::from_secs(60);
        let ran_at = plain
            .run(Lane::Background, move || {
                job_threads.wait_for_quiet(far);
                Ok(Instant::now())
            })
            .await
            .unwrap();
        assert!(ran_at < far);
    }
}
