//! A fake OpenAI-compatible `/v1/chat/completions` endpoint: it serves scripted answers in order,
//! then asks a responder (which may read the prompt), and records every request.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// Prompt tokens every answer reports.
pub const FAKE_PROMPT_TOKENS: u64 = 20;
/// Completion tokens every answer reports.
pub const FAKE_COMPLETION_TOKENS: u64 = 5;

/// One answer of the fake endpoint.
#[derive(Debug, Clone)]
pub enum FakeAnswer {
    /// A normal answer whose message content is `value.to_string()`.
    Json(Value),
    /// A normal answer with this message content, as is (fenced, not JSON, ...).
    RawContent(String),
    /// A bare HTTP status, with `Retry-After` seconds when given.
    Status {
        status: u16,
        retry_after_secs: Option<u64>,
    },
    /// The model declines: `refusal` set, content null.
    Refusal(String),
    /// The answer cut at the token cap: this partial content, `finish_reason` "length".
    Truncated(String),
    /// This whole response body, with status 200 (for shapes the others do not cover).
    Body(Value),
}

type Responder = Arc<dyn Fn(&Value) -> FakeAnswer + Send + Sync>;

#[derive(Default)]
struct Shared {
    script: VecDeque<FakeAnswer>,
    responder: Option<Responder>,
    requests: Vec<Value>,
    authorizations: Vec<Option<String>>,
}

type SharedState = Arc<Mutex<Shared>>;

/// The fake endpoint, on a free local port until dropped.
pub struct FakeLlm {
    address: SocketAddr,
    shared: SharedState,
    server: JoinHandle<()>,
}

impl FakeLlm {
    /// Listens on 127.0.0.1 at a free port. With nothing scripted and no responder, requests get
    /// a 400 saying so.
    pub async fn start() -> Self {
        let shared = SharedState::default();
        let app = axum::Router::new()
            .route(
                "/v1/chat/completions",
                axum::routing::post(chat_completions),
            )
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake llm: cannot bind a local port");
        let address = listener.local_addr().expect("fake llm: no local address");
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("fake llm: server failed");
        });
        Self {
            address,
            shared,
            server,
        }
    }

    /// `http://127.0.0.1:<port>`, the base URL a client appends `/v1/chat/completions` to.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Serves `answer` after those already scripted.
    pub fn push(&self, answer: FakeAnswer) {
        self.lock().script.push_back(answer);
    }

    pub fn push_json(&self, value: Value) {
        self.push(FakeAnswer::Json(value));
    }

    pub fn push_raw_content(&self, content: &str) {
        self.push(FakeAnswer::RawContent(content.to_owned()));
    }

    pub fn push_status(&self, status: u16, retry_after_secs: Option<u64>) {
        self.push(FakeAnswer::Status {
            status,
            retry_after_secs,
        });
    }

    pub fn push_refusal(&self, refusal: &str) {
        self.push(FakeAnswer::Refusal(refusal.to_owned()));
    }

    pub fn push_truncated(&self, partial_content: &str) {
        self.push(FakeAnswer::Truncated(partial_content.to_owned()));
    }

    pub fn push_body(&self, body: Value) {
        self.push(FakeAnswer::Body(body));
    }

    /// Answers requests once the script is used up, from the request body (to answer by the
    /// prompt: `body["messages"][1]["content"]` is the user message).
    pub fn set_responder(&self, responder: impl Fn(&Value) -> FakeAnswer + Send + Sync + 'static) {
        self.lock().responder = Some(Arc::new(responder));
    }

    /// Every request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.lock().requests.clone()
    }

    /// The `Authorization` header of every request, in order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.lock().authorizations.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn chat_completions(
    State(shared): State<SharedState>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let (scripted, responder) = {
        let mut shared = shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        shared.requests.push(body.clone());
        shared.authorizations.push(
            headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
        );
        (shared.script.pop_front(), shared.responder.clone())
    };
    // The responder runs without the lock, so it may call back into the fake.
    let answer = match (scripted, responder) {
        (Some(answer), _) => answer,
        (None, Some(responder)) => responder(&body),
        (None, None) => {
            return (
                StatusCode::BAD_REQUEST,
                "fake llm: no scripted answer and no responder",
            )
                .into_response();
        }
    };
    respond(&body, answer)
}

fn respond(request: &Value, answer: FakeAnswer) -> Response {
    match answer {
        FakeAnswer::Json(value) => completion(request, json!(value.to_string()), None, "stop"),
        FakeAnswer::RawContent(content) => completion(request, json!(content), None, "stop"),
        FakeAnswer::Refusal(refusal) => completion(request, Value::Null, Some(refusal), "stop"),
        FakeAnswer::Truncated(partial) => completion(request, json!(partial), None, "length"),
        FakeAnswer::Body(body) => Json(body).into_response(),
        FakeAnswer::Status {
            status,
            retry_after_secs,
        } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = (status, format!("fake llm: {status}")).into_response();
            if let Some(seconds) = retry_after_secs {
                response.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from(seconds),
                );
            }
            response
        }
    }
}

fn completion(request: &Value, content: Value, refusal: Option<String>, finish: &str) -> Response {
    Json(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": request["model"],
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": refusal},
            "finish_reason": finish,
        }],
        "usage": {
            "prompt_tokens": FAKE_PROMPT_TOKENS,
            "completion_tokens": FAKE_COMPLETION_TOKENS,
            "total_tokens": FAKE_PROMPT_TOKENS + FAKE_COMPLETION_TOKENS,
        },
    }))
    .into_response()
}
