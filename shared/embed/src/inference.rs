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

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use crate::{EmbedError, EmbedFuture};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed set of threads, at one nice value, that run inference jobs in arrival order.
pub(crate) struct InferenceThreads {
    jobs: mpsc::Sender<Job>,
    nice: i32,
}

impl std::fmt::Debug for InferenceThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InferenceThreads")
            .field("nice", &self.nice)
            .finish_non_exhaustive()
    }
}

impl InferenceThreads {
    /// Starts `threads` threads (at least one) at `nice` (0: the process's own priority). A nice
    /// value the process may not take (a negative one without CAP_SYS_NICE) is logged and the
    /// threads run at the process's priority.
    pub(crate) fn start(threads: usize, nice: i32) -> Result<Arc<Self>, EmbedError> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        for index in 0..threads.max(1) {
            let receiver = receiver.clone();
            std::thread::Builder::new()
                .name(format!("engram-model-{index}"))
                .spawn(move || {
                    lower_priority(nice);
                    loop {
                        // The lock is held only while waiting for the next job; a closed
                        // channel (every embedder dropped) ends the thread.
                        let next = receiver.lock().map(|jobs| jobs.recv());
                        match next {
                            // A panicking job loses its answer (its caller gets an error),
                            // not the thread.
                            Ok(Ok(job)) => {
                                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                            }
                            _ => break,
                        }
                    }
                })
                .map_err(|error| {
                    EmbedError::Inference(format!("cannot start a model thread: {error}"))
                })?;
        }
        Ok(Arc::new(Self { jobs: sender, nice }))
    }

    /// Queues a job for the next free model thread.
    fn submit(&self, job: Job) -> Result<(), EmbedError> {
        self.jobs
            .send(job)
            .map_err(|_| EmbedError::Inference("the model threads have stopped".into()))
    }

    /// Runs `work` on a model thread and waits for it without blocking the async runtime.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, EmbedError> + Send + 'static,
    ) -> Result<T, EmbedError> {
        let (done, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // The caller may have given up waiting (a timeout); its answer is then dropped.
            let _ = done.send(work());
        });
        self.submit(job)?;
        result
            .await
            .map_err(|_| EmbedError::Inference("an inference job panicked".into()))?
    }

    /// An embedder's `embed`: `embed_texts` over a copy of `texts` on a model thread (the local
    /// model and the token vectors built on it share these threads).
    pub(crate) fn embed<'a>(
        &'a self,
        texts: &[String],
        embed_texts: impl FnOnce(&[String]) -> Result<Vec<Vec<f32>>, EmbedError> + Send + 'static,
    ) -> EmbedFuture<'a> {
        let texts = texts.to_vec();
        Box::pin(self.run(move || embed_texts(&texts)))
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
        self.submit(job)?;
        result
            .recv()
            .map_err(|_| EmbedError::Inference("an inference job panicked".into()))?
    }

    pub(crate) fn nice(&self) -> i32 {
        self.nice
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
        let threads = InferenceThreads::start(2, 7).unwrap();
        let before = current_thread_nice().unwrap();
        let nice = threads.run(|| Ok(current_thread_nice())).await.unwrap();
        assert_eq!(nice, Some((before + 7).min(19)));
        let name = threads
            .run(|| Ok(std::thread::current().name().map(str::to_owned)))
            .await
            .unwrap();
        assert!(name.unwrap().starts_with("engram-model-"));
        // The caller's own priority is untouched.
        assert_eq!(current_thread_nice().unwrap(), before);
    }

    #[tokio::test]
    async fn threads_spawned_by_a_job_inherit_its_nice_value() {
        let threads = InferenceThreads::start(1, 5).unwrap();
        let before = current_thread_nice().unwrap();
        let inherited = threads
            .run(|| {
                Ok(std::thread::spawn(current_thread_nice)
                    .join()
                    .expect("the child thread ran"))
            })
            .await
            .unwrap();
        assert_eq!(inherited, Some((before + 5).min(19)));
    }

    #[tokio::test]
    async fn a_failing_job_is_an_error_and_the_threads_go_on() {
        let threads = InferenceThreads::start(1, 0).unwrap();
        let failed = threads
            .run(|| -> Result<(), EmbedError> { Err(EmbedError::Inference("bad".into())) })
            .await;
        assert!(failed.is_err());
        assert_eq!(threads.run(|| Ok(1)).await.unwrap(), 1);
        assert_eq!(threads.run_blocking(|| Ok(2)).unwrap(), 2);
    }
}
