//! Reading a chat-completions answer into the caller's type, without I/O: the refusal, the
//! token cap, fences around the JSON, and the fit to the type each have their own error.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::LlmError;

/// Tokens an endpoint reports having read and written.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl TokenUsage {
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

impl std::ops::AddAssign for TokenUsage {
    fn add_assign(&mut self, other: Self) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
    }
}

/// The parts of a `chat.completion` object the client reads; everything else is ignored, and
/// everything here may be missing (local servers differ).
#[derive(Debug, Deserialize)]
struct ChatResponse {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    message: Option<Message>,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    content: Option<String>,
    refusal: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// The usage a 200 answer reports (counted even when the answer is unusable: it was paid for),
/// and the value it holds or why it holds none.
pub(crate) fn read_answer<T: DeserializeOwned>(body: &[u8]) -> (TokenUsage, Result<T, LlmError>) {
    let response: ChatResponse = match serde_json::from_slice(body) {
        Ok(response) => response,
        Err(error) => {
            return (
                TokenUsage::default(),
                Err(LlmError::Malformed(format!(
                    "the response is not a chat completion: {error}"
                ))),
            );
        }
    };
    let usage = response
        .usage
        .map_or_else(TokenUsage::default, |usage| TokenUsage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
        });
    (usage, value_of_first_choice(response.choices))
}

fn value_of_first_choice<T: DeserializeOwned>(choices: Vec<Choice>) -> Result<T, LlmError> {
    let Some(choice) = choices.into_iter().next() else {
        return Err(LlmError::Malformed("the response has no choices".into()));
    };
    let message = choice.message.unwrap_or(Message {
        content: None,
        refusal: None,
    });
    if let Some(refusal) = message.refusal {
        return Err(LlmError::Refused(refusal));
    }
    match choice.finish_reason.as_deref() {
        Some("length") => return Err(LlmError::Truncated),
        // OpenAI withholds the content it filtered: as good as a refusal.
        Some("content_filter") => {
            return Err(LlmError::Refused(
                "the content filter withheld the answer".into(),
            ));
        }
        _ => {}
    }
    let Some(content) = message.content else {
        return Err(LlmError::Malformed("the answer has no content".into()));
    };
    let json: serde_json::Value = serde_json::from_str(strip_code_fences(&content))
        .map_err(|error| LlmError::Malformed(format!("the answer is not json: {error}")))?;
    serde_json::from_value(json).map_err(|error| {
        LlmError::Malformed(format!("the answer does not match the schema: {error}"))
    })
}

/// The JSON inside a Markdown code fence (```` ```json ... ``` ````), which local servers add
/// around structured answers; content without a fence is returned trimmed.
pub(crate) fn strip_code_fences(content: &str) -> &str {
    let trimmed = content.trim();
    let Some(inside) = trimmed.strip_prefix("```") else {
        return trimmed;
    };
    let inside = inside.strip_suffix("```").unwrap_or(inside);
    // The opening fence may name a language (```json); JSON itself never starts with a letter.
    let inside = match inside.split_once('\n') {
        Some((language, rest)) if language.trim().chars().all(|c| c.is_ascii_alphanumeric()) => {
            rest
        }
        _ => inside.trim_start_matches(|c: char| c.is_ascii_alphanumeric()),
    };
    inside.trim()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Title {
        title: String,
    }

    fn completion(message: serde_json::Value, finish_reason: &str) -> Vec<u8> {
        json!({
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn fences_are_stripped_with_or_without_a_language() {
        assert_eq!(strip_code_fences("```json\n{\"a\": 1}\n```"), "{\"a\": 1}");
        assert_eq!(strip_code_fences("  ```\n{\"a\": 1}\n```\n"), "{\"a\": 1}");
        assert_eq!(strip_code_fences("```JSON \n[1, 2]```"), "[1, 2]");
        assert_eq!(strip_code_fences("```json{\"a\": 1}```"), "{\"a\": 1}");
        assert_eq!(strip_code_fences(" {\"a\": 1} "), "{\"a\": 1}");
        // Fences inside the JSON are left alone.
        assert_eq!(
            strip_code_fences("{\"code\": \"```x```\"}"),
            "{\"code\": \"```x```\"}"
        );
    }

    #[test]
    fn a_good_answer_is_read_with_its_usage() {
        let body = completion(
            json!({"role": "assistant", "content": "{\"title\": \"Deploys\"}", "refusal": null}),
            "stop",
        );
        let (usage, value) = read_answer::<Title>(&body);
        assert_eq!(
            value.unwrap(),
            Title {
                title: "Deploys".into()
            }
        );
        assert_eq!(
            usage,
            TokenUsage {
                prompt_tokens: 12,
                completion_tokens: 3
            }
        );
        assert_eq!(usage.total(), 15);
    }

    #[test]
    fn each_unusable_answer_has_its_error_and_keeps_its_usage() {
        let cases = [
            (
                completion(json!({"content": null, "refusal": "I can't"}), "stop"),
                "refused",
            ),
            (
                completion(json!({"content": "{\"tit"}), "length"),
                "truncated",
            ),
            (
                completion(json!({"content": "a title"}), "stop"),
                "not json",
            ),
            (
                completion(json!({"content": "{\"name\": 1}"}), "stop"),
                "does not match the schema",
            ),
            (completion(json!({"content": null}), "stop"), "no content"),
            (
                completion(json!({"content": null}), "content_filter"),
                "content filter",
            ),
        ];
        for (body, expected) in cases {
            let (usage, value) = read_answer::<Title>(&body);
            let error = value.unwrap_err();
            assert!(error.is_invalid_answer(), "{error}");
            let shown = match &error {
                LlmError::Truncated => "truncated".to_owned(),
                LlmError::Refused(reason) => format!("refused {reason}"),
                other => other.to_string(),
            };
            assert!(shown.contains(expected), "{shown} should say {expected}");
            assert_eq!(usage.total(), 15, "{expected}: the tokens were spent");
        }
    }

    #[test]
    fn a_response_without_choices_or_json_is_malformed() {
        let (usage, value) = read_answer::<Title>(br#"{"choices": [], "usage": null}"#);
        assert!(matches!(value, Err(LlmError::Malformed(ref m)) if m.contains("no choices")));
        assert_eq!(usage, TokenUsage::default());
        let (_, value) = read_answer::<Title>(b"<html>bad gateway</html>");
        assert!(
            matches!(value, Err(LlmError::Malformed(ref m)) if m.contains("not a chat completion"))
        );
        let (_, value) = read_answer::<Title>(br#"{"usage": {"prompt_tokens": 1}}"#);
        assert!(matches!(value, Err(LlmError::Malformed(_))));
    }
}
