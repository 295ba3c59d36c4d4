//! Structured JSON answers from a language model, through one [`ChatClient`] for any
//! OpenAI-compatible `/v1/chat/completions` endpoint (OpenAI, vLLM, Ollama, llama.cpp server).
//!
//! A caller (segment titles and summaries, fact extraction, conflict detection, the memory
//! reviewer) sends a [`StructuredRequest`]: a system prompt, a user message and the JSON Schema
//! of the object it expects. The client asks for that schema through `response_format`, reads
//! the answer into the caller's type, and never makes one up: transport failures, 429 and 5xx
//! are retried with jittered exponential backoff (honouring `Retry-After`), invalid answers
//! (malformed, truncated, refused, not matching the type) get a bounded number of fresh
//! attempts, and what still fails comes back as an [`LlmError`]. Token usage is summed over the
//! attempts and counted in [`LlmMetrics`]. A response body is read up to
//! `llm.max_response_bytes` and no further: a longer one is an unusable answer too.
//!
//! [`LlmSettings`] (the `llm.*` configuration, off by default) chooses whether a client exists.

#![forbid(unsafe_code)]

mod answer;
mod client;
mod error;
mod metrics;
mod settings;

pub use answer::TokenUsage;
pub use client::{ChatClient, Structured, StructuredRequest};
pub use error::LlmError;
pub use metrics::LlmMetrics;
pub use settings::{DEFAULT_MAX_RESPONSE_BYTES, LlmProvider, LlmSettings};
