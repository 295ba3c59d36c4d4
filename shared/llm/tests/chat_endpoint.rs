//! The chat client against a fake OpenAI-compatible endpoint: the request it sends, answers it
//! accepts, answers it rejects and asks again for, and the transport failures it retries.

use std::time::{Duration, Instant};

use engram_llm::{ChatClient, LlmError, LlmProvider, LlmSettings, StructuredRequest, TokenUsage};
use engram_testkit::{FAKE_COMPLETION_TOKENS, FAKE_PROMPT_TOKENS, FakeAnswer, FakeLlm};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize, PartialEq)]
struct Summary {
    title: String,
    points: Vec<String>,
}

fn summary_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "points": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["title", "points"],
        "additionalProperties": false
    })
}

fn good_answer() -> Value {
    json!({"title": "Deploy notes", "points": ["tag first", "then roll out"]})
}

fn settings(fake: &FakeLlm) -> LlmSettings {
    LlmSettings {
        provider: LlmProvider::Openai,
        base_url: fake.base_url(),
        model: "test-model".into(),
        api_key: None,
        timeout_secs: 5,
        max_retries: 2,
        invalid_answer_retries: 1,
        max_tokens: 300,
        temperature: 0.0,
        max_response_bytes: engram_llm::DEFAULT_MAX_RESPONSE_BYTES,
    }
}

fn client(fake: &FakeLlm) -> ChatClient {
    ChatClient::from_settings(&settings(fake))
        .unwrap()
        .expect("the openai provider gives a client")
}

/// One answer's usage, times `answers`.
fn usage_of(answers: u64) -> TokenUsage {
    TokenUsage {
        prompt_tokens: FAKE_PROMPT_TOKENS * answers,
        completion_tokens: FAKE_COMPLETION_TOKENS * answers,
    }
}

async fn ask(client: &ChatClient) -> Result<engram_llm::Structured<Summary>, LlmError> {
    let schema = summary_schema();
    client
        .structured(&StructuredRequest {
            task: "segment_summary",
            system: "You summarize conversations.",
            user: "# Conversation\n\nWe deployed on Friday.",
            schema: &schema,
        })
        .await
}

#[tokio::test]
async fn a_good_answer_is_parsed_and_the_request_carries_the_schema() {
    let fake = FakeLlm::start().await;
    fake.push_json(good_answer());
    let client = ChatClient::from_settings(&LlmSettings {
        api_key: Some("sk-test".to_owned().into()),
        temperature: 0.5,
        ..settings(&fake)
    })
    .unwrap()
    .unwrap();
    assert_eq!(client.model(), "test-model");

    let answer = ask(&client).await.unwrap();
    assert_eq!(answer.value.title, "Deploy notes");
    assert_eq!(answer.value.points, ["tag first", "then roll out"]);
    assert_eq!(answer.attempts, 1);
    assert_eq!(answer.usage, usage_of(1));

    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0],
        json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "You summarize conversations."},
                {"role": "user", "content": "# Conversation\n\nWe deployed on Friday."}
            ],
            "temperature": 0.5,
            "max_tokens": 300,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "segment_summary", "strict": true, "schema": summary_schema()}
            }
        })
    );
    assert_eq!(fake.authorizations(), [Some("Bearer sk-test".to_owned())]);
    let metrics = client.metrics();
    assert_eq!((metrics.requests_ok(), metrics.requests_failed()), (1, 0));
    assert_eq!(metrics.usage(), usage_of(1));
}

#[tokio::test]
async fn no_key_means_no_authorization_header() {
    let fake = FakeLlm::start().await;
    fake.push_json(good_answer());
    ask(&client(&fake)).await.unwrap();
    assert_eq!(fake.authorizations(), [None]);
}

#[tokio::test]
async fn json_in_a_code_fence_is_accepted() {
    let fake = FakeLlm::start().await;
    fake.push_raw_content(&format!("```json\n{:#}\n```", good_answer()));
    let answer = ask(&client(&fake)).await.unwrap();
    assert_eq!(answer.value.title, "Deploy notes");
    assert_eq!(answer.attempts, 1);
}

#[tokio::test]
async fn a_malformed_answer_is_asked_again_and_usage_is_summed() {
    let fake = FakeLlm::start().await;
    fake.push_raw_content("Sure! The title is Deploy notes.");
    fake.push_json(good_answer());
    let client = client(&fake);
    let answer = ask(&client).await.unwrap();
    assert_eq!(answer.value.title, "Deploy notes");
    assert_eq!(answer.attempts, 2);
    assert_eq!(answer.usage, usage_of(2));
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(
        fake.requests()[0],
        fake.requests()[1],
        "the second attempt is the same request"
    );
    let metrics = client.metrics();
    assert_eq!(metrics.invalid_answers(), 1);
    assert_eq!((metrics.requests_ok(), metrics.requests_failed()), (1, 0));
    assert_eq!(metrics.usage(), usage_of(2));
}

#[tokio::test]
async fn malformed_answers_beyond_the_budget_are_an_error() {
    let fake = FakeLlm::start().await;
    fake.push_raw_content("not json");
    fake.push_raw_content("{\"title\": ");
    fake.push_json(good_answer());
    let client = client(&fake);
    let error = ask(&client).await.unwrap_err();
    assert!(matches!(error, LlmError::Malformed(_)), "{error}");
    assert!(error.is_invalid_answer());
    assert!(!error.is_retryable());
    assert_eq!(
        fake.requests().len(),
        2,
        "one attempt plus invalid_answer_retries = 1"
    );
    let metrics = client.metrics();
    assert_eq!(metrics.invalid_answers(), 2);
    assert_eq!((metrics.requests_ok(), metrics.requests_failed()), (0, 1));
    assert_eq!(metrics.usage(), usage_of(2), "spent tokens are counted");
}

#[tokio::test]
async fn no_fresh_attempts_when_invalid_answer_retries_is_zero() {
    let fake = FakeLlm::start().await;
    fake.push_raw_content("not json");
    fake.push_json(good_answer());
    let client = ChatClient::from_settings(&LlmSettings {
        invalid_answer_retries: 0,
        ..settings(&fake)
    })
    .unwrap()
    .unwrap();
    let error = ask(&client).await.unwrap_err();
    assert!(matches!(error, LlmError::Malformed(_)), "{error}");
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn a_refusal_is_refused() {
    let fake = FakeLlm::start().await;
    fake.push_refusal("I can't help with that.");
    fake.push_refusal("Still no.");
    let error = ask(&client(&fake)).await.unwrap_err();
    match error {
        LlmError::Refused(reason) => assert_eq!(reason, "Still no."),
        other => panic!("expected a refusal, got {other}"),
    }
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn a_truncated_answer_is_truncated() {
    let fake = FakeLlm::start().await;
    fake.push_truncated("{\"title\": \"Deploy");
    fake.push_truncated("{\"title\": \"Dep");
    let error = ask(&client(&fake)).await.unwrap_err();
    assert!(matches!(error, LlmError::Truncated), "{error}");
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn a_truncated_answer_then_a_good_one_succeeds() {
    let fake = FakeLlm::start().await;
    fake.push_truncated("{\"title\": \"Deploy");
    fake.push_json(good_answer());
    let answer = ask(&client(&fake)).await.unwrap();
    assert_eq!(answer.attempts, 2);
}

#[tokio::test]
async fn json_of_the_wrong_shape_is_malformed_with_serdes_reason() {
    let fake = FakeLlm::start().await;
    fake.push_json(json!({"title": 42}));
    fake.push_json(json!({"name": "Deploy notes"}));
    let error = ask(&client(&fake)).await.unwrap_err();
    match &error {
        LlmError::Malformed(reason) => {
            assert!(reason.contains("does not match the schema"), "{reason}");
            assert!(reason.contains("missing field `title`"), "{reason}");
        }
        other => panic!("expected malformed, got {other}"),
    }
}

#[tokio::test]
async fn a_response_without_choices_is_malformed() {
    let fake = FakeLlm::start().await;
    fake.push(FakeAnswer::Body(
        json!({"object": "chat.completion", "choices": []}),
    ));
    fake.push_body(json!({"error": "oops"}));
    let error = ask(&client(&fake)).await.unwrap_err();
    assert!(
        matches!(&error, LlmError::Malformed(reason) if reason.contains("no choices")),
        "{error}"
    );
}

#[tokio::test]
async fn a_server_error_is_retried() {
    let fake = FakeLlm::start().await;
    fake.push_status(503, None);
    fake.push_json(good_answer());
    let answer = ask(&client(&fake)).await.unwrap();
    assert_eq!(answer.value, serde_json::from_value(good_answer()).unwrap());
    assert_eq!(answer.attempts, 2, "transport retries count as attempts");
    assert_eq!(answer.usage, usage_of(1), "the 503 reported no usage");
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn retry_after_is_honoured_on_429() {
    let fake = FakeLlm::start().await;
    fake.push_status(429, Some(1));
    fake.push_json(good_answer());
    let started = Instant::now();
    let answer = ask(&client(&fake)).await.unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(950), "waited {waited:?}");
    assert_eq!(answer.attempts, 2);
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn server_errors_beyond_the_retry_budget_are_an_error() {
    let fake = FakeLlm::start().await;
    fake.set_responder(|_| FakeAnswer::Status {
        status: 502,
        retry_after_secs: None,
    });
    let client = client(&fake);
    let error = ask(&client).await.unwrap_err();
    assert!(
        matches!(error, LlmError::Server { status: 502, .. }),
        "{error}"
    );
    assert!(error.is_retryable());
    assert_eq!(
        fake.requests().len(),
        3,
        "first attempt plus max_retries = 2"
    );
    assert_eq!(client.metrics().requests_failed(), 1);
    assert_eq!(client.metrics().invalid_answers(), 0);
}

#[tokio::test]
async fn a_bad_request_is_rejected_without_retry() {
    let fake = FakeLlm::start().await;
    fake.push_status(400, None);
    fake.push_json(good_answer());
    let error = ask(&client(&fake)).await.unwrap_err();
    match &error {
        LlmError::Rejected { status, body } => {
            assert_eq!(*status, 400);
            assert!(body.contains("fake llm"), "{body}");
        }
        other => panic!("expected rejected, got {other}"),
    }
    assert!(!error.is_retryable());
    assert!(!error.is_invalid_answer());
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn the_responder_answers_from_the_prompt_once_the_script_is_used_up() {
    let fake = FakeLlm::start().await;
    fake.push_json(json!({"title": "scripted", "points": []}));
    fake.set_responder(|request| {
        let user = request["messages"][1]["content"]
            .as_str()
            .unwrap_or_default();
        FakeAnswer::Json(json!({"title": format!("{} chars", user.len()), "points": []}))
    });
    let client = client(&fake);
    assert_eq!(ask(&client).await.unwrap().value.title, "scripted");
    assert_eq!(ask(&client).await.unwrap().value.title, "38 chars");
    assert_eq!(fake.requests().len(), 2);
}

/// An answer longer than `max_response_bytes` is an unusable answer: asked again like a malformed
/// one, and the caller gets `TooLarge` when the fresh attempts are used up.
#[tokio::test]
async fn an_answer_beyond_max_response_bytes_is_too_large_and_asked_again() {
    let fake = FakeLlm::start().await;
    let huge = json!({"title": "x".repeat(100 * 1024), "points": []});
    fake.push_json(huge.clone());
    fake.push_json(good_answer());
    let client = ChatClient::from_settings(&LlmSettings {
        max_response_bytes: 64 * 1024,
        ..settings(&fake)
    })
    .unwrap()
    .unwrap();
    let answer = ask(&client).await.unwrap();
    assert_eq!(answer.value.title, "Deploy notes");
    assert_eq!(answer.attempts, 2);
    assert_eq!(client.metrics().invalid_answers(), 1);

    fake.push_json(huge.clone());
    fake.push_json(huge);
    let error = ask(&client).await.unwrap_err();
    assert!(
        matches!(error, LlmError::TooLarge { limit_bytes } if limit_bytes == 64 * 1024),
        "{error}"
    );
    assert!(error.is_invalid_answer() && !error.is_retryable());
    assert!(
        error.to_string().contains("llm.max_response_bytes"),
        "{error}"
    );
    assert_eq!(fake.requests().len(), 4);
}

/// An endpoint that streams a body without announcing its length, and never ends it: the client
/// stops reading at the cap instead of buffering until the timeout.
#[tokio::test]
async fn an_endless_unannounced_body_is_cut_at_the_cap() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                // The whole request: its head, then `content-length` bytes of body.
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                loop {
                    let text = String::from_utf8_lossy(&request).to_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length: usize = text
                            .lines()
                            .find_map(|line| line.strip_prefix("content-length:"))
                            .and_then(|value| value.trim().parse().ok())
                            .unwrap_or(0);
                        if request.len() >= end + 4 + length {
                            break;
                        }
                    }
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => request.extend_from_slice(&buffer[..read]),
                    }
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                            transfer-encoding: chunked\r\n\r\n";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = format!("{:x}\r\n{}\r\n", 16 * 1024, " ".repeat(16 * 1024));
                // Until the client hangs up.
                while socket.write_all(chunk.as_bytes()).await.is_ok() {}
            });
        }
    });
    let client = ChatClient::from_settings(&LlmSettings {
        provider: LlmProvider::Openai,
        base_url,
        model: "m".into(),
        timeout_secs: 5,
        max_response_bytes: 256 * 1024,
        invalid_answer_retries: 0,
        ..LlmSettings::default()
    })
    .unwrap()
    .unwrap();
    let started = Instant::now();
    let error = ask(&client).await.unwrap_err();
    assert!(matches!(error, LlmError::TooLarge { .. }), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "cut at the cap, not at the timeout: {:?}",
        started.elapsed()
    );
    server.abort();
}

#[tokio::test]
async fn an_unreachable_endpoint_is_unavailable_and_retryable() {
    // A port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base_url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let client = ChatClient::from_settings(&LlmSettings {
        provider: LlmProvider::Openai,
        base_url,
        max_retries: 1,
        ..LlmSettings::default()
    })
    .unwrap()
    .unwrap();
    let error = ask(&client).await.unwrap_err();
    assert!(matches!(error, LlmError::Unavailable(_)), "{error}");
    assert!(error.is_retryable());
}

#[tokio::test]
async fn an_invalid_task_name_is_refused_before_sending() {
    let fake = FakeLlm::start().await;
    let schema = summary_schema();
    let error = client(&fake)
        .structured::<Summary>(&StructuredRequest {
            task: "segment summary",
            system: "s",
            user: "u",
            schema: &schema,
        })
        .await
        .unwrap_err();
    assert!(matches!(error, LlmError::Config(_)), "{error}");
    assert!(fake.requests().is_empty());
}

#[test]
fn the_disabled_provider_gives_no_client() {
    assert!(
        ChatClient::from_settings(&LlmSettings::default())
            .unwrap()
            .is_none()
    );
    let error = ChatClient::from_settings(&LlmSettings {
        provider: LlmProvider::Openai,
        model: String::new(),
        ..LlmSettings::default()
    })
    .unwrap_err();
    assert!(matches!(error, LlmError::Config(_)), "{error}");
}
