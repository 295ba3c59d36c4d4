//! Query embeddings for retrieval. Concurrent queries are embedded together (dynamic
//! micro-batching: while one batch runs, the next gathers, so a busy service runs large batches
//! and an idle one answers a lone query at once), and repeated queries come from a cache
//! (concurrent requests for the same text share one computation).

use std::sync::Arc;
use std::time::Duration;

use engram_embed::Embedder;
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, Clone, Copy)]
pub struct QueryEmbedderSettings {
    /// Most queries embedded in one pass.
    pub max_batch: usize,
    /// Query embeddings kept.
    pub cache_entries: u64,
    /// Longest wait for an embedding before retrieval goes on without the dense leg.
    pub timeout: Duration,
}

type Reply = Result<Arc<Vec<f32>>, String>;

struct Job {
    text: String,
    reply: oneshot::Sender<Reply>,
}

/// Embeds queries through one batching worker, with a cache in front.
#[derive(Clone)]
pub struct QueryEmbedder {
    model_id: String,
    jobs: mpsc::Sender<Job>,
    cache: moka::future::Cache<String, Arc<Vec<f32>>>,
    timeout: Duration,
}

impl std::fmt::Debug for QueryEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEmbedder")
            .field("model_id", &self.model_id)
            .finish_non_exhaustive()
    }
}

impl QueryEmbedder {
    /// Starts the batching worker on the current runtime.
    pub fn start(embedder: Arc<dyn Embedder>, settings: QueryEmbedderSettings) -> Self {
        let max_batch = settings.max_batch.max(1);
        let (jobs, queue) = mpsc::channel(max_batch * 64);
        let model_id = embedder.model_id().to_owned();
        tokio::spawn(run_batches(embedder, queue, max_batch));
        Self {
            model_id,
            jobs,
            cache: moka::future::Cache::new(settings.cache_entries),
            timeout: settings.timeout,
        }
    }

    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// The embedding of a query; errors say why (the caller falls back to sparse search).
    pub async fn embed(&self, query: &str) -> Result<Arc<Vec<f32>>, String> {
        let key = query.trim().to_owned();
        let compute = async {
            let (reply, answer) = oneshot::channel();
            self.jobs
                .send(Job {
                    text: key.clone(),
                    reply,
                })
                .await
                .map_err(|_| "the query embedder has stopped".to_owned())?;
            answer
                .await
                .map_err(|_| "the query embedder dropped the request".to_owned())?
        };
        let cached = self.cache.try_get_with(key.clone(), compute);
        match tokio::time::timeout(self.timeout, cached).await {
            Ok(Ok(embedding)) => Ok(embedding),
            Ok(Err(error)) => Err((*error).clone()),
            Err(_) => Err(format!(
                "no query embedding within {} ms",
                self.timeout.as_millis()
            )),
        }
    }
}

async fn run_batches(
    embedder: Arc<dyn Embedder>,
    mut queue: mpsc::Receiver<Job>,
    max_batch: usize,
) {
    let mut batch: Vec<Job> = Vec::with_capacity(max_batch);
    while queue.recv_many(&mut batch, max_batch).await > 0 {
        // A caller that gave up (timeout) no longer needs its embedding.
        batch.retain(|job| !job.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let texts: Vec<String> = batch.iter().map(|job| job.text.clone()).collect();
        match embedder.embed(&texts).await {
            Ok(vectors) if vectors.len() == batch.len() => {
                for (job, vector) in batch.drain(..).zip(vectors) {
                    let _ = job.reply.send(Ok(Arc::new(vector)));
                }
            }
            Ok(vectors) => {
                let reason = format!(
                    "embedder returned {} vectors for {} queries",
                    vectors.len(),
                    batch.len()
                );
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(reason.clone()));
                }
            }
            Err(error) => {
                tracing::warn!(error = %error, queries = batch.len(), "query embedding failed");
                let reason = error.to_string();
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(reason.clone()));
                }
            }
        }
    }
}
