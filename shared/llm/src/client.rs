//! The chat-completions client: one request shape (system + user message, a JSON Schema in
//! `response_format`), retries of transport failures with backoff, fresh attempts for invalid
//! answers.

use std::sync::Arc;
use std::time::Duration;

use backon::Retryable as _;
use engram_core::backoff::jittered_backoff;
use secrecy::{ExposeSecret as _, SecretString};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::answer::read_answer;
use crate::{LlmError, LlmMetrics, LlmProvider, LlmSettings, TokenUsage};

/// First backoff delay after a transport failure; doubles per attempt, with jitter.
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A server's `Retry-After` is believed up to this long.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Characters of a rejected request's response body kept in the error.
const BODY_EXCERPT_CHARS: usize = 512;
/// Bytes of a rejected request's response body read for that excerpt.
const BODY_EXCERPT_BYTES: usize = 16 * 1024;
/// OpenAI's limit on `json_schema.name`.
const MAX_TASK_NAME_CHARS: usize = 64;

/// One question whose answer must be a JSON object matching `schema`.
#[derive(Debug, Clone, Copy)]
pub struct StructuredRequest<'a> {
    /// Short name such as `segment_summary`: the `json_schema` name (letters, digits, `_`, `-`,
    /// at most 64), and the `task` of logs and metrics.
    pub task: &'a str,
    pub system: &'a str,
    /// The user message (Markdown).
    pub user: &'a str,
    /// JSON Schema of the expected object. It is sent with `strict: true`, which OpenAI only
    /// accepts when every object lists all its properties as `required` and sets
    /// `"additionalProperties": false`.
    pub schema: &'a serde_json::Value,
}

/// A usable answer.
#[derive(Debug, Clone)]
pub struct Structured<T> {
    pub value: T,
    /// Tokens of every attempt, the unusable ones included.
    pub usage: TokenUsage,
    /// HTTP requests sent: 1 when the first answer was usable; transport retries and fresh
    /// attempts after invalid answers each add one.
    pub attempts: u32,
}

/// A client for one model behind an OpenAI-compatible `/v1/chat/completions` endpoint. Cheap to
/// clone; clones share the connection pool and the metrics.
#[derive(Debug, Clone)]
pub struct ChatClient {
    http: reqwest::Client,
    url: String,
    model: String,
    api_key: Option<SecretString>,
    max_retries: usize,
    invalid_answer_retries: usize,
    max_tokens: u32,
    temperature: f32,
    max_response_bytes: usize,
    metrics: Arc<LlmMetrics>,
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: [ChatMessage<'a>; 2],
    temperature: f32,
    max_tokens: u32,
    response_format: ResponseFormat<'a>,
}

#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct ResponseFormat<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    json_schema: JsonSchemaFormat<'a>,
}

#[derive(Serialize)]
struct JsonSchemaFormat<'a> {
    name: &'a str,
    strict: bool,
    schema: &'a serde_json::Value,
}

impl ChatClient {
    /// The configured client, or `None` when the provider is `disabled`.
    pub fn from_settings(settings: &LlmSettings) -> Result<Option<Self>, LlmError> {
        match settings.provider {
            LlmProvider::Disabled => Ok(None),
            LlmProvider::Openai => Self::new(settings).map(Some),
        }
    }

    fn new(settings: &LlmSettings) -> Result<Self, LlmError> {
        settings.check().map_err(LlmError::Config)?;
        // rustls is built with ring (no C toolchain needed); install it as the process-wide
        // provider once. An error only means a provider is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(settings.timeout_secs))
            .build()
            .map_err(|error| {
                LlmError::Config(format!("cannot build the http client: {}", chain(&error)))
            })?;
        Ok(Self {
            http,
            url: format!(
                "{}/v1/chat/completions",
                settings.base_url.trim().trim_end_matches('/')
            ),
            model: settings.model.clone(),
            api_key: settings.api_key.clone(),
            max_retries: settings.max_retries,
            invalid_answer_retries: settings.invalid_answer_retries,
            max_tokens: settings.max_tokens,
            temperature: settings.temperature,
            max_response_bytes: settings.max_response_bytes,
            metrics: Arc::new(LlmMetrics::default()),
        })
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn metrics(&self) -> &Arc<LlmMetrics> {
        &self.metrics
    }

    /// Asks the model and reads its answer into `T`. Transport failures, 429 and 5xx are
    /// retried up to `max_retries` times with backoff; an unusable answer gets up to
    /// `invalid_answer_retries` fresh attempts; then the last error is returned.
    pub async fn structured<T: DeserializeOwned>(
        &self,
        request: &StructuredRequest<'_>,
    ) -> Result<Structured<T>, LlmError> {
        let result = self.structured_with_retries(request).await;
        self.metrics.record_outcome(request.task, result.is_ok());
        result
    }

    async fn structured_with_retries<T: DeserializeOwned>(
        &self,
        request: &StructuredRequest<'_>,
    ) -> Result<Structured<T>, LlmError> {
        let task = request.task;
        check_task_name(task).map_err(LlmError::Config)?;
        let body = self.encode(request)?;
        tracing::debug!(
            task,
            model = %self.model,
            system = request.system,
            user = request.user,
            "asking the llm"
        );
        let mut usage = TokenUsage::default();
        let mut attempts = 0u32;
        let mut fresh_attempts_left = self.invalid_answer_retries;
        loop {
            let (answer, (answer_usage, value)) =
                match self.post_with_retries(task, &body, &mut attempts).await {
                    Ok(answer) => {
                        let read = read_answer::<T>(&answer);
                        (answer, read)
                    }
                    // An answer too large to read is as unusable as a malformed one.
                    Err(error) if error.is_invalid_answer() => {
                        (Vec::new(), (TokenUsage::default(), Err(error)))
                    }
                    Err(error) => {
                        tracing::warn!(task, attempts, %error, "llm request failed");
                        return Err(error);
                    }
                };
            usage += answer_usage;
            self.metrics.record_usage(task, answer_usage);
            let error = match value {
                Ok(value) => {
                    tracing::info!(
                        task,
                        attempts,
                        prompt_tokens = usage.prompt_tokens,
                        completion_tokens = usage.completion_tokens,
                        "llm answered"
                    );
                    return Ok(Structured {
                        value,
                        usage,
                        attempts,
                    });
                }
                Err(error) => error,
            };
            self.metrics.record_invalid_answer(task);
            tracing::debug!(
                task,
                answer = %String::from_utf8_lossy(&answer),
                "invalid llm answer"
            );
            if fresh_attempts_left == 0 {
                tracing::warn!(
                    task,
                    attempts,
                    prompt_tokens = usage.prompt_tokens,
                    completion_tokens = usage.completion_tokens,
                    %error,
                    "llm answer is invalid; giving up"
                );
                return Err(error);
            }
            fresh_attempts_left -= 1;
            tracing::warn!(task, attempts, %error, "llm answer is invalid; asking again");
        }
    }

    fn encode(&self, request: &StructuredRequest<'_>) -> Result<Vec<u8>, LlmError> {
        let body = ChatRequest {
            model: &self.model,
            messages: [
                ChatMessage {
                    role: "system",
                    content: request.system,
                },
                ChatMessage {
                    role: "user",
                    content: request.user,
                },
            ],
            temperature: self.temperature,
            max_tokens: self.max_tokens,
            response_format: ResponseFormat {
                kind: "json_schema",
                json_schema: JsonSchemaFormat {
                    name: request.task,
                    strict: true,
                    schema: request.schema,
                },
            },
        };
        serde_json::to_vec(&body)
            .map_err(|error| LlmError::Config(format!("cannot encode the request: {error}")))
    }

    /// The body of a 200 answer, after retrying what may succeed later; counts every request
    /// sent in `attempts`.
    async fn post_with_retries(
        &self,
        task: &str,
        body: &[u8],
        attempts: &mut u32,
    ) -> Result<Vec<u8>, LlmError> {
        let backoff = jittered_backoff(MIN_BACKOFF, MAX_BACKOFF).with_max_times(self.max_retries);
        (|| {
            *attempts += 1;
            self.post_once(body)
        })
        .retry(backoff)
        .when(LlmError::is_retryable)
        // A server that says when to come back is believed (within reason).
        .adjust(|error, delay| match error.retry_after() {
            Some(after) => delay.map(|_| after.min(MAX_RETRY_AFTER)),
            None => delay,
        })
        .notify(|error, delay| tracing::warn!(task, %error, ?delay, "llm request failed; retrying"))
        .await
    }

    async fn post_once(&self, body: &[u8]) -> Result<Vec<u8>, LlmError> {
        let mut request = self
            .http
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose_secret());
        }
        let response = request
            .send()
            .await
            .map_err(|error| LlmError::Unavailable(chain(&error)))?;
        let status = response.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(LlmError::RateLimited {
                retry_after: retry_after(response.headers()),
            });
        }
        if status.is_server_error() {
            return Err(LlmError::Server {
                status: status.as_u16(),
                retry_after: retry_after(response.headers()),
            });
        }
        if !status.is_success() {
            let body = read_capped(response, BODY_EXCERPT_BYTES)
                .await
                .map(|body| body.bytes)
                .unwrap_or_default();
            return Err(LlmError::Rejected {
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body)
                    .chars()
                    .take(BODY_EXCERPT_CHARS)
                    .collect(),
            });
        }
        let body = read_capped(response, self.max_response_bytes)
            .await
            .map_err(|error| LlmError::Unavailable(chain(&error)))?;
        if !body.complete {
            return Err(LlmError::TooLarge {
                limit_bytes: self.max_response_bytes,
            });
        }
        Ok(body.bytes)
    }
}

/// A response body, read up to a limit.
struct CappedBody {
    bytes: Vec<u8>,
    /// Whether `bytes` is the whole body (false: it was longer than the limit).
    complete: bool,
}

/// Reads at most `limit` bytes of a body, chunk by chunk, and stops there: a body announced
/// longer than the limit (`Content-Length`) is not read at all, one that turns out longer is
/// read no further than the chunk that crossed it.
async fn read_capped(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<CappedBody, reqwest::Error> {
    let announced = response.content_length();
    if announced.is_some_and(|length| length > limit as u64) {
        return Ok(CappedBody {
            bytes: Vec::new(),
            complete: false,
        });
    }
    let mut bytes = Vec::with_capacity(announced.map_or(0, |length| length as usize));
    while let Some(chunk) = response.chunk().await? {
        let room = limit - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok(CappedBody {
                bytes,
                complete: false,
            });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(CappedBody {
        bytes,
        complete: true,
    })
}

/// `Retry-After` in seconds (the HTTP-date form is ignored: the backoff applies).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// An error with its causes ("error sending request: connection refused"), which reqwest's own
/// message leaves out.
fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// OpenAI accepts `json_schema.name` of 1 to 64 letters, digits, `_` and `-`.
fn check_task_name(task: &str) -> Result<(), String> {
    let valid = !task.is_empty()
        && task.chars().count() <= MAX_TASK_NAME_CHARS
        && task
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "task name {task:?} must be 1 to {MAX_TASK_NAME_CHARS} letters, digits, '_' or '-'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_names_follow_the_json_schema_name_rules() {
        assert!(check_task_name("segment_summary").is_ok());
        assert!(check_task_name("review-grade-2").is_ok());
        assert!(check_task_name(&"a".repeat(64)).is_ok());
        assert!(check_task_name("").is_err());
        assert!(check_task_name(&"a".repeat(65)).is_err());
        assert!(check_task_name("segment summary").is_err());
        assert!(check_task_name("résumé").is_err());
    }

    #[test]
    fn retry_after_reads_seconds_only() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(reqwest::header::RETRY_AFTER, " 7".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn the_request_body_asks_for_the_schema() {
        let settings = LlmSettings {
            provider: LlmProvider::Openai,
            model: "m".into(),
            temperature: 0.2,
            max_tokens: 77,
            ..LlmSettings::default()
        };
        let client = ChatClient::from_settings(&settings).unwrap().unwrap();
        let schema = serde_json::json!({"type": "object"});
        let body = client
            .encode(&StructuredRequest {
                task: "t",
                system: "s",
                user: "u",
                schema: &schema,
            })
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "model": "m",
                "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                "temperature": 0.2,
                "max_tokens": 77,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "t", "strict": true, "schema": {"type": "object"}}
                }
            })
        );
    }
}
