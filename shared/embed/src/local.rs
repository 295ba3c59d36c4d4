//! all-MiniLM-L6-v2 on the CPU with candle.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use crate::inference::{InferenceThreads, Lane, YieldToRequests};
use crate::{EmbedError, EmbedFuture, Embedder, normalize};

/// Where the model lives and how it is run.
#[derive(Debug, Clone)]
pub struct LocalModelSettings {
    /// Directory with `model.safetensors`, `tokenizer.json` and `config.json`.
    pub model_dir: PathBuf,
    /// Texts per forward pass; larger batches are split.
    pub max_batch: usize,
    /// Tokens per text (sentence-transformers uses 256 for this model); longer texts are cut.
    pub max_tokens: usize,
    /// Nice value of the threads inference runs on (0: the process's; 10 for services whose
    /// inference is background work beside latency-bound requests; see `inference.rs`).
    pub inference_nice: i32,
    /// Whether work nobody waits for ([`Embedder::embed_between_requests`]) runs only in the
    /// gaps between the service's requests.
    pub yield_to_requests: Option<YieldToRequests>,
}

struct Model {
    bert: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    dimension: usize,
    /// `[CLS]` and `[SEP]`, which frame a text (and a lone token, see `embed_token_ids_blocking`).
    framing: (u32, u32),
}

/// The local embedding model; cheap to clone.
#[derive(Clone)]
pub struct LocalEmbedder {
    model: Arc<Model>,
    model_id: String,
    max_batch: usize,
    threads: Arc<InferenceThreads>,
}

fn load_error(path: &Path, reason: impl ToString) -> EmbedError {
    EmbedError::Load {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The model's weights, each linear layer's matrix stored transposed (same shape and values,
/// column-major in memory). A linear layer multiplies by the transpose of its weight: stored as
/// shipped, that transpose is a strided view, and the matrix multiplication copied it element by
/// element into its packed layout on every pass, which was 40 % of a query's model pass (`perf`
/// during `make bench-retrieval`, issue 41). Laid out this way, the transpose it reads is
/// contiguous and is packed at the speed of a copy. Embeddings and layer norms are left alone.
fn linear_weights_laid_out_for_matmul(
    weights: &[u8],
    device: &Device,
) -> candle_core::Result<VarBuilder<'static>> {
    let mut tensors = candle_core::safetensors::load_buffer(weights, device)?;
    for (name, tensor) in tensors.iter_mut() {
        // In the precision the model runs in first: a later conversion would copy the matrix
        // back into row-major order.
        *tensor = tensor.to_dtype(DType::F32)?;
        if tensor.rank() == 2 && !name.contains("embeddings.") {
            *tensor = tensor.t()?.contiguous()?.t()?;
        }
    }
    Ok(VarBuilder::from_tensors(tensors, DType::F32, device))
}

impl LocalEmbedder {
    /// Loads weights, tokenizer and config (blocking: call at start-up or in `spawn_blocking`).
    pub fn load(settings: &LocalModelSettings) -> Result<Self, EmbedError> {
        let dir = &settings.model_dir;
        let config_path = dir.join("config.json");
        let config: Config = serde_json::from_str(
            &std::fs::read_to_string(&config_path).map_err(|e| load_error(&config_path, e))?,
        )
        .map_err(|e| load_error(&config_path, e))?;
        let dimension = config.hidden_size;

        let tokenizer_path = dir.join("tokenizer.json");
        let mut tokenizer =
            Tokenizer::from_file(&tokenizer_path).map_err(|e| load_error(&tokenizer_path, e))?;
        // The shipped tokenizer pads and cuts every text to a fixed 128 tokens; pad to the longest
        // text of a batch instead (padding is masked out, so it does not change an embedding) and
        // cut at the model's sequence limit.
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..Default::default()
        }));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: settings.max_tokens,
                ..Default::default()
            }))
            .map_err(|e| load_error(&tokenizer_path, e))?;

        let framing = match (
            tokenizer.token_to_id("[CLS]"),
            tokenizer.token_to_id("[SEP]"),
        ) {
            (Some(cls), Some(sep)) => (cls, sep),
            _ => return Err(load_error(&tokenizer_path, "no [CLS] or [SEP] token")),
        };

        let weights_path = dir.join("model.safetensors");
        let weights = std::fs::read(&weights_path).map_err(|e| load_error(&weights_path, e))?;
        let device = Device::Cpu;
        let vars = linear_weights_laid_out_for_matmul(&weights, &device)
            .map_err(|e| load_error(&weights_path, e))?;
        let bert = BertModel::load(vars, &config).map_err(|e| load_error(&weights_path, e))?;

        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let embedder = Self {
            model: Arc::new(Model {
                bert,
                tokenizer,
                device,
                dimension,
                framing,
            }),
            model_id: "sentence-transformers/all-MiniLM-L6-v2".to_owned(),
            max_batch: settings.max_batch.max(1),
            threads: InferenceThreads::start(
                cores,
                settings.inference_nice,
                settings.yield_to_requests.clone(),
            )?,
        };
        // One pass now, on a model thread: candle starts its worker threads at its first
        // operation, and they take the nice value of the thread that starts them.
        let warm = embedder.clone();
        embedder
            .threads
            .run_blocking(move || warm.embed_blocking(&["warm up".to_owned()]).map(drop))?;
        tracing::info!(
            threads = cores,
            nice = embedder.threads.nice(),
            background_between_requests = ?settings.yield_to_requests.as_ref().map(|y| y.quiet),
            "local embedding model loaded"
        );
        Ok(embedder)
    }

    /// The threads this model's inference runs on (shared by the embedders built on it).
    pub(crate) fn inference_threads(&self) -> &Arc<InferenceThreads> {
        &self.threads
    }

    /// Embeds synchronously (the caller is on a blocking thread), in the order of `texts`.
    ///
    /// A batch is padded to its longest text, so texts of like length are batched together
    /// (longest first): a batch mixing an episode's summary with a few short facts or turns
    /// would otherwise spend most of its work on padding (about half of it on conversation
    /// turns, docs/benchmarks/conversations.md). Padding is masked out, so batching does not change an
    /// embedding.
    pub fn embed_blocking(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_passes_blocking(texts, None)
    }

    /// [`Self::embed_blocking`]; with `between_requests`, each forward pass first waits for a
    /// gap between the service's requests, starting no later than the given instant.
    fn embed_passes_blocking(
        &self,
        texts: &[String],
        between_requests: Option<Instant>,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let order = by_length(texts);
        let mut vectors = vec![Vec::new(); texts.len()];
        for batch in order.chunks(self.max_batch) {
            if let Some(not_after) = between_requests {
                self.threads.wait_for_quiet(not_after);
            }
            let batch_texts: Vec<&str> = batch.iter().map(|&i| texts[i].as_str()).collect();
            let embedded = self.model.forward(batch_texts)?;
            if embedded.len() != batch.len() {
                return Err(EmbedError::Inference(
                    "the model returned fewer vectors than texts".into(),
                ));
            }
            for (&i, vector) in batch.iter().zip(embedded) {
                vectors[i] = vector;
            }
        }
        Ok(vectors)
    }

    /// The model's tokenizer (padding to the longest text of a batch, cut at `max_tokens`).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.model.tokenizer
    }

    /// The sentence embedding of each vocabulary id alone (`[CLS] id [SEP]`): the static token
    /// vectors of [`crate::TokenVectorEmbedder`]. Synchronous, like [`Self::embed_blocking`].
    pub fn embed_token_ids_blocking(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let inference = |e: candle_core::Error| EmbedError::Inference(e.to_string());
        let (cls, sep) = self.model.framing;
        let framed: Vec<u32> = ids.iter().flat_map(|&id| [cls, id, sep]).collect();
        let device = &self.model.device;
        let ids = Tensor::from_vec(framed, (ids.len(), 3), device).map_err(inference)?;
        let type_ids = ids.zeros_like().map_err(inference)?;
        let mask = ids.ones_like().map_err(inference)?;
        self.model.pool(&ids, &type_ids, &mask)
    }
}

/// Indices of `texts`, longest first (by bytes: a cheap stand-in for the token count, close
/// enough to keep like with like); equal lengths keep their order.
fn by_length(texts: &[String]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(texts[i].len()));
    order
}

impl Model {
    fn forward(&self, texts: Vec<&str>) -> Result<Vec<Vec<f32>>, EmbedError> {
        let inference = |e: candle_core::Error| EmbedError::Inference(e.to_string());
        let encodings = self
            .tokenizer
            .encode_batch(texts, true)
            .map_err(|e| EmbedError::Inference(e.to_string()))?;
        let rows = encodings.len();
        let columns = encodings.first().map_or(0, |e| e.get_ids().len());
        let flatten = |get: &dyn Fn(&tokenizers::Encoding) -> &[u32]| -> Vec<u32> {
            encodings
                .iter()
                .flat_map(|e| get(e).iter().copied())
                .collect()
        };
        let ids = Tensor::from_vec(flatten(&|e| e.get_ids()), (rows, columns), &self.device)
            .map_err(inference)?;
        let type_ids = Tensor::from_vec(
            flatten(&|e| e.get_type_ids()),
            (rows, columns),
            &self.device,
        )
        .map_err(inference)?;
        let mask = Tensor::from_vec(
            flatten(&|e| e.get_attention_mask()),
            (rows, columns),
            &self.device,
        )
        .map_err(inference)?;

        self.pool(&ids, &type_ids, &mask)
    }

    /// Runs the model and pools each row: the masked mean of its tokens' states (padding does
    /// not count), scaled to unit length.
    fn pool(
        &self,
        ids: &Tensor,
        type_ids: &Tensor,
        mask: &Tensor,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let inference = |e: candle_core::Error| EmbedError::Inference(e.to_string());
        let hidden = self
            .bert
            .forward(ids, type_ids, Some(mask))
            .map_err(inference)?;
        let mask = mask
            .to_dtype(DType::F32)
            .map_err(inference)?
            .unsqueeze(2)
            .map_err(inference)?;
        let summed = hidden
            .broadcast_mul(&mask)
            .map_err(inference)?
            .sum(1)
            .map_err(inference)?;
        let counts = mask.sum(1).map_err(inference)?;
        let pooled = summed.broadcast_div(&counts).map_err(inference)?;
        let mut vectors: Vec<Vec<f32>> = pooled.to_vec2().map_err(inference)?;
        vectors.iter_mut().for_each(|vector| normalize(vector));
        Ok(vectors)
    }
}

impl Embedder for LocalEmbedder {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn dimension(&self) -> usize {
        self.model.dimension
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> EmbedFuture<'a> {
        let embedder = self.clone();
        self.threads.embed(Lane::Background, texts, move |texts| {
            embedder.embed_blocking(texts)
        })
    }

    fn embed_between_requests<'a>(
        &'a self,
        texts: &'a [String],
        not_after: Instant,
    ) -> EmbedFuture<'a> {
        // Without a yield policy the wait before each pass returns at once.
        let embedder = self.clone();
        self.threads.embed(Lane::Background, texts, move |texts| {
            embedder.embed_passes_blocking(texts, Some(not_after))
        })
    }
}
