//! Bad input gets InvalidArgument with a message that says what was wrong, and changes nothing.

use engram_e2e::Sandbox;
use engram_proto::v1;
use prost::bytes::{Buf as _, BufMut as _};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::helpers::{assert_status, new_scope, remember};

#[tokio::test]
async fn invalid_requests_are_rejected_precisely() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let cases: Vec<(v1::RememberRequest, &str)> = vec![
        (
            v1::RememberRequest {
                scope: None,
                ..remember(&scope, "x")
            },
            "scope: is required",
        ),
        (
            remember(
                &v1::Scope {
                    user_id: "alice".into(),
                    ..scope.clone()
                },
                "x",
            ),
            "scope.user_id: must be a UUID",
        ),
        (
            remember(
                &v1::Scope {
                    user_id: "00000000-0000-0000-0000-000000000000".into(),
                    ..scope.clone()
                },
                "x",
            ),
            "scope.user_id: must not be the nil UUID",
        ),
        (
            remember(
                &v1::Scope {
                    space: "".into(),
                    ..scope.clone()
                },
                "x",
            ),
            "scope.space: is required",
        ),
        (
            remember(
                &v1::Scope {
                    space: "a b".into(),
                    ..scope.clone()
                },
                "x",
            ),
            "scope.space: may hold only",
        ),
        (remember(&scope, "   "), "text: must not be empty"),
        (
            remember(&scope, "\u{200b}\u{200b}\u{feff}"),
            "text: must not be empty",
        ),
        (
            v1::RememberRequest {
                tags: vec!["a\u{7}\u{1b}[31m".into()],
                ..remember(&scope, "x")
            },
            "tags[0]: must not contain control characters",
        ),
        (
            remember(&scope, &"x".repeat(8193)),
            "text: is 8193 characters long; the limit is 8192",
        ),
        (
            v1::RememberRequest {
                category: 99,
                ..remember(&scope, "x")
            },
            "category: 99 is not a known category",
        ),
        (
            v1::RememberRequest {
                role: -1,
                ..remember(&scope, "x")
            },
            "role: -1 is not a known speaker role",
        ),
        (
            v1::RememberRequest {
                tags: vec!["".into()],
                ..remember(&scope, "x")
            },
            "tags[0]: must not be empty",
        ),
        (
            v1::RememberRequest {
                tags: vec!["t".into(); 33],
                ..remember(&scope, "x")
            },
            "tags: has 33 items",
        ),
        (
            v1::RememberRequest {
                conversation_id: "c1".into(),
                ..remember(&scope, "x")
            },
            "conversation_id: must be a UUID",
        ),
    ];
    for (request, message) in cases {
        let status = sandbox.ingest.remember(request).await.unwrap_err();
        assert_status(status, Code::InvalidArgument, message);
    }

    let status = sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(scope.clone()),
            memory_id: "42".into(),
        })
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "memory_id: must be a UUID");
    let status = sandbox
        .ingest
        .update_settings(v1::UpdateSettingsRequest {
            scope: Some(scope.clone()),
            soft_cap: Some(2_000_000),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "soft_cap: is 2000000");
    let status = sandbox
        .ingest
        .update_settings(v1::UpdateSettingsRequest {
            scope: Some(scope.clone()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "sets nothing");
    let status = sandbox
        .ingest
        .list_audit(v1::ListAuditRequest {
            scope: Some(scope.clone()),
            page_size: 501,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "page_size: is 501");
    let status = sandbox
        .ingest
        .list_audit(v1::ListAuditRequest {
            scope: Some(scope.clone()),
            page_token: "abc".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "page_token");
    let status = sandbox
        .ingest
        .apply_command(v1::ApplyCommandRequest {
            scope: Some(scope.clone()),
            conversation_id: String::new(),
            message: "forget that".into(),
        })
        .await
        .unwrap_err();
    assert_status(
        status,
        Code::InvalidArgument,
        "conversation_id: is required",
    );
    let status = sandbox
        .ingest
        .start_incognito(v1::StartIncognitoRequest {
            scope: Some(scope.clone()),
            conversation_id: "x".into(),
        })
        .await
        .unwrap_err();
    assert_status(
        status,
        Code::InvalidArgument,
        "conversation_id: must be a UUID",
    );
    // Over the server's 4 MiB message limit: refused before any handler, with the status gRPC
    // specifies for it.
    let status = sandbox
        .ingest
        .remember(remember(&scope, &"x".repeat(5 * 1024 * 1024)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let status = sandbox
        .ingest
        .end_incognito(v1::EndIncognitoRequest {
            scope: Some(scope.clone()),
            conversation_id: "00000000-0000-0000-0000-000000000000".into(),
        })
        .await
        .unwrap_err();
    assert_status(
        status,
        Code::InvalidArgument,
        "conversation_id: must not be the nil UUID",
    );
    let status = sandbox
        .ingest
        .pin(v1::PinRequest {
            scope: Some(scope.clone()),
            memory_id: "00000000-0000-0000-0000-000000000000".into(),
        })
        .await
        .unwrap_err();
    assert_status(
        status,
        Code::InvalidArgument,
        "memory_id: must not be the nil UUID",
    );
    let status = sandbox
        .retrieval
        .list_entries(v1::ListEntriesRequest {
            scope: Some(scope.clone()),
            kind: 7,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(
        status,
        Code::InvalidArgument,
        "kind: 7 is not a known memory kind",
    );

    // Nothing was written by any of it.
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(audited, 0);
}

#[tokio::test]
async fn internal_errors_do_not_leak_sql() {
    let mut sandbox = Sandbox::start().await;
    // Break the store under the service: the client must see an opaque error.
    sqlx::query("ALTER TABLE memories RENAME TO memories_moved")
        .execute(&sandbox.pool)
        .await
        .unwrap();
    let status = sandbox
        .ingest
        .remember(remember(&new_scope("work"), "hello world of memory"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(status.message(), "internal error");
    let status = sandbox
        .retrieval
        .list_entries(v1::ListEntriesRequest {
            scope: Some(new_scope("work")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.message(), "internal error");
}

/// Sends bytes as they are, whatever the method expects: a client with a broken encoder.
#[derive(Debug, Clone, Copy, Default)]
struct RawBytes;

impl Codec for RawBytes {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawBytes;
    type Decoder = RawBytes;

    fn encoder(&mut self) -> RawBytes {
        RawBytes
    }

    fn decoder(&mut self) -> RawBytes {
        RawBytes
    }
}

impl Encoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawBytes {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

#[tokio::test]
async fn a_request_that_is_not_a_valid_message_is_invalid_argument() {
    let sandbox = Sandbox::start().await;
    // Field 1 (the scope) announced as 5 bytes long, with 1 byte following.
    let truncated = vec![0x0a, 0x05, 0x01];
    let methods = [
        (
            0,
            "/engram.v1.IngestService/Remember",
            "engram.v1.RememberRequest",
        ),
        (
            0,
            "/engram.v1.IngestService/ApplyCommand",
            "engram.v1.ApplyCommandRequest",
        ),
        (
            1,
            "/engram.v1.RetrievalService/RetrieveMemory",
            "engram.v1.RetrieveMemoryRequest",
        ),
        (
            1,
            "/engram.v1.RetrievalService/ExportSpace",
            "engram.v1.ExportSpaceRequest",
        ),
        (
            2,
            "/engram.v1.ReviewService/GetMemoryState",
            "engram.v1.GetMemoryStateRequest",
        ),
    ];
    for (service, path, message) in methods {
        let mut client = tonic::client::Grpc::new(sandbox.services[service].channel().await);
        client.ready().await.unwrap();
        let status = client
            .unary(
                tonic::Request::new(truncated.clone()),
                tonic::codegen::http::uri::PathAndQuery::from_static(path),
                RawBytes,
            )
            .await
            .unwrap_err();
        assert_status(
            status,
            Code::InvalidArgument,
            &format!("the request body is not a valid {message} message"),
        );
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
}

/// Terminal escapes and bidi overrides were stored and returned as given, so a memory could
/// recolor or rewrite an operator's terminal, or reorder what an LLM reads; a query of only
/// zero-width characters was searched for. Text is cleaned on the way in, identifiers are
/// refused, invisible queries are invalid.
#[tokio::test]
async fn text_cannot_steer_a_terminal_or_reorder_what_a_model_reads() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let stored = sandbox
        .ingest
        .remember(remember(
            &scope,
            "\u{1b}[2J\u{1b}[31mMy door code\u{1b}[0m is \u{202e}4321\u{202c}\r\nreally",
        ))
        .await
        .unwrap()
        .into_inner()
        .memory
        .unwrap();
    assert_eq!(stored.text, "My door code is 4321\nreally");

    let answer = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(scope.clone()),
            query: "door \u{1b}[1mcode".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        answer.markdown.contains("My door code is 4321 really"),
        "{}",
        answer.markdown
    );
    assert!(!answer.markdown.contains('\u{1b}') && !answer.markdown.contains('\u{202e}'));

    let status = sandbox
        .retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(scope.clone()),
            query: "\u{200b}\u{200d}\u{feff}".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "query: must not be empty");
    let status = sandbox
        .ingest
        .remember(remember(&scope, "\u{1b}[2J\u{1b}[H"))
        .await
        .unwrap_err();
    assert_status(status, Code::InvalidArgument, "text: must not be empty");
    let status = sandbox
        .ingest
        .remember(v1::RememberRequest {
            tags: vec!["admin\u{202e}txt".into()],
            ..remember(&scope, "Tagged with an override")
        })
        .await
        .unwrap_err();
    assert_status(
        status,
        Code::InvalidArgument,
        "tags[0]: must not contain control characters",
    );
}

/// GradeMemories took any query: a NUL answered INTERNAL (Postgres refused to record it), and
/// 10,000 queries or one of 1 MiB were recorded with the review. Each query is now what
/// RetrieveMemory takes as one, at most 32 per memory; bad ones are InvalidArgument naming the
/// query, and nothing is recorded.
#[tokio::test]
async fn grade_memories_queries_are_validated_like_a_retrieval_query() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let reviewed = chrono::Utc::now() - chrono::Duration::days(3);
    crate::helpers::import(
        &mut sandbox,
        &scope,
        vec![v1::ImportedMemory {
            client_id: "deploys".into(),
            kind: v1::MemoryKind::Episodic.into(),
            title: "Deploy day".into(),
            text: "The user moved the deploys to Fridays".into(),
            conversation_id: uuid::Uuid::new_v4().to_string(),
            created_at: Some(engram_server::time::to_proto(reviewed)),
            ..Default::default()
        }],
    )
    .await;
    let episode = crate::helpers::entries(&mut sandbox, &scope)
        .await
        .remove(0);
    let grading = |queries: Vec<String>| v1::GradeMemoriesRequest {
        scope: Some(scope.clone()),
        context: vec![v1::Message {
            role: v1::SpeakerRole::Assistant.into(),
            content: "Deploys are on Fridays, per your notes.".into(),
        }],
        memories: vec![v1::MemoryToGrade {
            memory_id: episode.id.clone(),
            queries,
        }],
        dry_run: false,
        grader: v1::Grader::Local.into(),
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["deploy day".into(), "deploy\u{0}day".into()],
            "memories[0].queries[1]: must not contain NUL characters",
        ),
        (
            vec!["x".repeat(1024 * 1024)],
            "memories[0].queries[0]: is 1048576 characters long; the limit is 2048",
        ),
        (
            (0..10_000).map(|n| format!("query {n}")).collect(),
            "memories[0].queries: has 10000 queries; the limit is 32",
        ),
        (
            vec!["\u{200b}".into()],
            "memories[0].queries[0]: must not be empty",
        ),
    ];
    for (queries, expected) in cases {
        let status = sandbox
            .review
            .grade_memories(grading(queries))
            .await
            .unwrap_err();
        assert_status(status, Code::InvalidArgument, expected);
    }
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM applied_reviews")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(recorded, 0);

    // Within the limits, escape sequences are removed as from any text.
    let graded = sandbox
        .review
        .grade_memories(grading(vec!["deploy \u{1b}[31mday".into()]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(graded.graded.len(), 1);
    let queries: Vec<String> = sqlx::query_scalar("SELECT unnest(queries) FROM applied_reviews")
        .fetch_all(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(queries, ["deploy day"]);
}
