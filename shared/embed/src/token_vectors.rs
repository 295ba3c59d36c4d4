//! Topic vectors without a transformer pass per text: static token vectors distilled from the
//! local model (the model2vec idea), for the comparisons that only ask whether two short texts
//! are about the same thing: segmentation's topic rules and the review service's local grader.
//!
//! A token's vector is the local model's sentence embedding of that token alone
//! (`[CLS] token [SEP]`, mean pooled, unit length), computed the first time the token is met
//! and kept for the life of the process: a handful of 3-token forward passes per new token,
//! and after the first few thousand texts hardly any, since conversations reuse a small part of
//! the vocabulary. A text's vector is the weighted mean of its tokens' vectors, with
//! smooth-inverse-frequency weights (Arora et al., 2017) so that "the" and "to" do not decide
//! what a turn is about, less the part every token's vector shares (their mean: about half of
//! a lone token's embedding is the same for all tokens, which kept unrelated texts at cosine
//! 0.6; without it they sit near 0, as the model's own embeddings do). Embedding a turn then costs microseconds instead of the model's
//! milliseconds, which is what lets segmentation keep up with a busy conversation stream on a
//! small machine (docs/benchmarks/conversations.md).
//!
//! The vectors live in a space of their own: compare them only with each other, never with
//! the model's sentence embeddings stored for search.

use std::sync::{Arc, OnceLock};

use tokenizers::Tokenizer;

use crate::inference::Lane;
use crate::{EmbedError, EmbedFuture, Embedder, LocalEmbedder, normalize};

/// SIF's `a`: a token of probability `p` weighs `a / (a + p)`. 1e-3 is the paper's choice for
/// word frequencies estimated from a large corpus.
const SIF_A: f64 = 1e-3;

/// Tokens embedded per forward pass when filling the cache (each is 3 positions long).
const TOKENS_PER_PASS: usize = 256;

/// Word pieces, evenly spaced over the vocabulary, whose mean stands for what all tokens'
/// vectors share (about a second of the model, once per process).
const COMMON_SAMPLE: usize = 512;

/// What [`TokenVectorEmbedder`] calls itself: stored turn vectors carry it.
pub const TOKEN_VECTORS_MODEL_ID: &str = "token-vectors/sentence-transformers/all-MiniLM-L6-v2";

/// Texts' vectors, when no model pass was needed, or else their token lists.
type KnownOrTokens = Result<Vec<Vec<f32>>, Vec<Vec<u32>>>;

/// Static token vectors over a [`LocalEmbedder`]; cheap to clone, the cache is shared.
#[derive(Clone)]
pub struct TokenVectorEmbedder {
    inner: Arc<Inner>,
}

struct Inner {
    model: LocalEmbedder,
    /// Tokenizes without special tokens, padding or truncation.
    tokenizer: Tokenizer,
    /// Per vocabulary id: its weight (0 for tokens that say nothing about a topic).
    weights: Vec<f32>,
    /// Per vocabulary id: its vector (the model's unit-length embedding of it), once computed.
    vectors: Vec<OnceLock<Box<[f32]>>>,
    /// The mean of the sample's vectors, once computed.
    common: OnceLock<Box<[f32]>>,
    /// The word pieces of that sample.
    common_sample: Vec<u32>,
}

impl TokenVectorEmbedder {
    /// Token vectors of `model`'s vocabulary (computed as tokens are met).
    pub fn new(model: LocalEmbedder) -> Self {
        let mut tokenizer = model.tokenizer().clone();
        tokenizer.with_padding(None);
        // Without truncation `with_truncation(None)` cannot fail.
        let _ = tokenizer.with_truncation(None);
        let weights = token_weights(&tokenizer);
        let vectors = (0..weights.len()).map(|_| OnceLock::new()).collect();
        let pieces: Vec<u32> = (0..weights.len() as u32)
            .filter(|&id| weights[id as usize] > 0.0 && weights[id as usize] < 1.0)
            .collect();
        let step = (pieces.len() / COMMON_SAMPLE).max(1);
        let common_sample = pieces.into_iter().step_by(step).collect();
        Self {
            inner: Arc::new(Inner {
                model,
                tokenizer,
                weights,
                vectors,
                common: OnceLock::new(),
                common_sample,
            }),
        }
    }

    /// Embeds synchronously (the caller is on a blocking thread), in the order of `texts`.
    pub fn embed_blocking(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let token_lists = self.token_lists(texts)?;
        self.embed_token_lists(&token_lists)
    }

    /// The vectors of `texts` if every token of theirs was met before, so that no model pass is
    /// needed (None otherwise). Synchronous, microseconds a text.
    pub fn embed_if_known(&self, texts: &[String]) -> Result<Option<Vec<Vec<f32>>>, EmbedError> {
        Ok(self.known_or_token_lists(texts)?.ok())
    }

    /// The vectors of `texts` if every token was met before, else their token lists (for
    /// [`Self::embed_token_lists`] on a model thread, not tokenized again).
    fn known_or_token_lists(&self, texts: &[String]) -> Result<KnownOrTokens, EmbedError> {
        let token_lists = self.token_lists(texts)?;
        let all_known = token_lists
            .iter()
            .flatten()
            .all(|&id| self.inner.vectors[id as usize].get().is_some());
        Ok(match self.inner.common.get() {
            Some(common) if all_known => Ok(self.weighted_means(&token_lists, common)),
            _ => Err(token_lists),
        })
    }

    /// The vectors of texts given as token lists, computing the tokens' vectors not met before.
    fn embed_token_lists(&self, token_lists: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.fill(token_lists)?;
        let common = self.common()?;
        Ok(self.weighted_means(token_lists, common))
    }

    /// Each text's tokens that say something about its topic (weight above 0).
    fn token_lists(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, EmbedError> {
        let inner = &self.inner;
        // One text after another: tokenizing a turn takes microseconds, and `encode_batch` would
        // hand each small batch to a thread pool that the grader's and segmentation's concurrent
        // calls then fight over.
        texts
            .iter()
            .map(|text| {
                let encoding = inner
                    .tokenizer
                    .encode(text.as_str(), false)
                    .map_err(|e| EmbedError::Inference(e.to_string()))?;
                Ok(encoding
                    .get_ids()
                    .iter()
                    .copied()
                    .filter(|&id| inner.weight(id) > 0.0)
                    .collect())
            })
            .collect()
    }

    /// Each token list's weighted mean of its tokens' vectors, less what all tokens share
    /// (`common`); every token's vector must have been computed.
    fn weighted_means(&self, token_lists: &[Vec<u32>], common: &[f32]) -> Vec<Vec<f32>> {
        let inner = &self.inner;
        token_lists
            .iter()
            .map(|ids| {
                // Σ w·(v − common), as Σ w·v − (Σ w)·common.
                let total_weight: f32 = ids.iter().map(|&id| inner.weight(id)).sum();
                let mut sum: Vec<f32> = common.iter().map(|c| -total_weight * c).collect();
                for &id in ids {
                    let weight = inner.weight(id);
                    let vector = inner.vectors[id as usize]
                        .get()
                        .expect("every token's vector was computed");
                    sum.iter_mut()
                        .zip(vector.iter())
                        .for_each(|(s, v)| *s += weight * v);
                }
                // A text of punctuation alone has no topic: its vector stays zero, which is
                // similar to nothing.
                normalize(&mut sum);
                sum
            })
            .collect()
    }

    /// What every token's vector shares: the mean of the sample's (computed on first use).
    fn common(&self) -> Result<&[f32], EmbedError> {
        let inner = &self.inner;
        if let Some(common) = inner.common.get() {
            return Ok(common);
        }
        self.fill(std::slice::from_ref(&inner.common_sample))?;
        let mut mean = vec![0.0f32; inner.model.dimension()];
        for &id in &inner.common_sample {
            let vector = inner.vectors[id as usize].get().expect("filled above");
            mean.iter_mut()
                .zip(vector.iter())
                .for_each(|(m, v)| *m += v);
        }
        let count = inner.common_sample.len().max(1) as f32;
        mean.iter_mut().for_each(|m| *m /= count);
        // Another batch may have computed it meanwhile: the same mean, keep either.
        let _ = inner.common.set(mean.into_boxed_slice());
        Ok(inner.common.get().expect("set above"))
    }

    /// Computes the vectors of the tokens not met before, a batch of tokens per forward pass.
    fn fill(&self, token_lists: &[Vec<u32>]) -> Result<(), EmbedError> {
        let inner = &self.inner;
        let mut missing: Vec<u32> = token_lists
            .iter()
            .flatten()
            .copied()
            .filter(|&id| inner.vectors[id as usize].get().is_none())
            .collect();
        missing.sort_unstable();
        missing.dedup();
        for pass in missing.chunks(TOKENS_PER_PASS) {
            let vectors = inner.model.embed_token_ids_blocking(pass)?;
            for (&id, vector) in pass.iter().zip(vectors) {
                // Another batch may have computed it meanwhile: the same vector, keep either.
                let _ = inner.vectors[id as usize].set(vector.into_boxed_slice());
            }
        }
        Ok(())
    }

    /// How many tokens have their vector computed (for tests and diagnostics).
    pub fn cached_tokens(&self) -> usize {
        self.inner
            .vectors
            .iter()
            .filter(|v| v.get().is_some())
            .count()
    }
}

impl Inner {
    fn weight(&self, id: u32) -> f32 {
        self.weights.get(id as usize).copied().unwrap_or(0.0)
    }
}

/// Each vocabulary id's weight. Special and unused tokens and lone punctuation weigh nothing.
/// Word pieces weigh by smooth inverse frequency, their frequency estimated from their rank in
/// the vocabulary: BERT's WordPiece vocabularies list the single characters first and then the
/// word pieces most frequent first ("the", "of", "and", ...), so rank r (from 1 at the first
/// piece longer than one character) stands for a Zipf probability 1 / (r · H), H the harmonic
/// number of the pieces. The single characters before them (letters, digits, CJK characters,
/// each a word of its own in Chinese) weigh 1.
fn token_weights(tokenizer: &Tokenizer) -> Vec<f32> {
    let size = tokenizer.get_vocab_size(true);
    let mut tokens: Vec<Option<String>> = vec![None; size];
    for (token, id) in tokenizer.get_vocab(true) {
        if let Some(slot) = tokens.get_mut(id as usize) {
            *slot = Some(token);
        }
    }
    let special: std::collections::HashSet<u32> = tokenizer
        .get_added_tokens_decoder()
        .iter()
        .filter(|(_, added)| added.special)
        .map(|(&id, _)| id)
        .collect();
    let is_word_piece = |token: &str| {
        !(token.starts_with('[') && token.ends_with(']'))
            && token.trim_start_matches("##").chars().count() > 1
    };
    let first_piece = tokens
        .iter()
        .position(|t| t.as_deref().is_some_and(is_word_piece))
        .unwrap_or(0);
    let pieces = (size - first_piece).max(1) as f64;
    let harmonic = pieces.ln() + 0.577_215_664_9;
    tokens
        .iter()
        .enumerate()
        .map(|(id, token)| {
            let Some(token) = token else { return 0.0 };
            if special.contains(&(id as u32))
                || (token.starts_with("[unused") && token.ends_with(']'))
            {
                return 0.0;
            }
            let bare = token.trim_start_matches("##");
            if !bare.chars().any(char::is_alphanumeric) {
                return 0.0;
            }
            if id < first_piece {
                // Weighing lone Latin letters and digits as frequent words ("a", "I", rank 10)
                // measured worse on both calibration sets (topic junctions found 28 % against
                // 38 % at the same splits, review agreement 57.1 % against 58.2 %), so every
                // single character weighs fully.
                return 1.0;
            }
            let rank = (id - first_piece + 1) as f64;
            let probability = 1.0 / (rank * harmonic);
            (SIF_A / (SIF_A + probability)) as f32
        })
        .collect()
}

impl Embedder for TokenVectorEmbedder {
    fn model_id(&self) -> &str {
        TOKEN_VECTORS_MODEL_ID
    }

    fn dimension(&self) -> usize {
        self.inner.model.dimension()
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> EmbedFuture<'a> {
        Box::pin(async move {
            // Once warm, every token of a text was met before and its vector is a weighted mean:
            // no model pass, so it need not queue on the model threads behind the passes for
            // other texts' new tokens (a query's turn vector waited there, milliseconds on the
            // path of a retrieval). Worked out on a blocking thread.
            let embedder = self.clone();
            let owned = texts.to_vec();
            let token_lists =
                match tokio::task::spawn_blocking(move || embedder.known_or_token_lists(&owned))
                    .await
                    .map_err(|_| EmbedError::Inference("a token-vector job panicked".into()))??
                {
                    Ok(vectors) => return Ok(vectors),
                    Err(token_lists) => token_lists,
                };
            let embedder = self.clone();
            self.inner
                .model
                .inference_threads()
                // Segmentation waits for these (a few new tokens at most, once warm): never
                // behind the backfill's batches.
                .run(Lane::Urgent, move || {
                    embedder.embed_token_lists(&token_lists)
                })
                .await
        })
    }
}
