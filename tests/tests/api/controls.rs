//! Forget with tombstones, pin/unpin, settings, incognito and the audit trail.

use engram_e2e::Sandbox;
use engram_proto::v1;
use tonic::Code;
use uuid::Uuid;

use crate::helpers::{
    Setting, assert_status, audit_actions, end_incognito, new_scope, outcome, remember,
    remember_memory, remember_response, space_settings, start_incognito, update_setting,
};

#[tokio::test]
async fn forget_deletes_and_a_tombstone_blocks_recreation() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let memory = remember_memory(
        &mut sandbox,
        &scope,
        "My passport number is in the blue folder",
    )
    .await;
    let forgotten = sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(scope.clone()),
            memory_id: memory.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(forgotten.memory_id, memory.id);
    let expires = forgotten.tombstone_expires_at.unwrap();
    let hours = (expires.seconds - memory.created_at.unwrap().seconds) as f64 / 3600.0;
    assert!(
        (hours - 24.0).abs() < 0.1,
        "tombstone lasts 24 hours, got {hours}"
    );

    // The same text, and a near-duplicate of it, are not re-created; the response says so.
    for text in [
        "My passport number is in the blue folder",
        "my passport number is in the  BLUE folder!",
    ] {
        let response = remember_response(&mut sandbox, remember(&scope, text)).await;
        assert_eq!(
            outcome(&response),
            v1::RememberOutcome::SuppressedByTombstone,
            "{text}"
        );
        assert!(response.memory.is_none());
        // The same instant to the nanosecond: a client may compare the two.
        assert_eq!(response.tombstone_expires_at.unwrap(), expires);
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);

    // Other spaces are not affected, and an expired tombstone no longer blocks.
    let other = v1::Scope {
        space: "home".into(),
        ..scope.clone()
    };
    let response = sandbox
        .ingest
        .remember(remember(&other, "My passport number is in the blue folder"))
        .await
        .unwrap();
    assert_eq!(outcome(response.get_ref()), v1::RememberOutcome::Created);
    sqlx::query("UPDATE tombstones SET expires_at = now() - interval '1 second'")
        .execute(&sandbox.pool)
        .await
        .unwrap();
    let response = sandbox
        .ingest
        .remember(remember(&scope, "My passport number is in the blue folder"))
        .await
        .unwrap();
    assert_eq!(outcome(response.get_ref()), v1::RememberOutcome::Created);

    // Forgetting what is not there (or is another space's) is NotFound.
    let missing = sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(scope.clone()),
            memory_id: Uuid::new_v4().to_string(),
        })
        .await
        .unwrap_err();
    assert_status(missing, Code::NotFound, "no memory");
}

#[tokio::test]
async fn pin_and_unpin() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let memory = remember_memory(&mut sandbox, &scope, "standup is at 9:30").await;
    let pinned = crate::helpers::pin(&mut sandbox, &scope, &memory.id).await;
    assert!(pinned.pinned);
    crate::helpers::assert_retention_in_step(&sandbox.pool).await;
    let unpinned = sandbox
        .ingest
        .unpin(v1::UnpinRequest {
            scope: Some(scope.clone()),
            memory_id: memory.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .memory
        .unwrap();
    assert!(!unpinned.pinned);
    crate::helpers::assert_retention_in_step(&sandbox.pool).await;
    // Another user's memory id cannot be pinned from this scope.
    let stranger = new_scope("work");
    let denied = sandbox
        .ingest
        .pin(v1::PinRequest {
            scope: Some(stranger),
            memory_id: memory.id.clone(),
        })
        .await
        .unwrap_err();
    assert_status(denied, Code::NotFound, "no memory");
}

#[tokio::test]
async fn memory_off_stores_nothing_until_turned_back_on() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let settings = update_setting(&mut sandbox, &scope, Setting::MemoryEnabled(false)).await;
    assert!(!settings.memory_enabled);
    let response = remember_response(&mut sandbox, remember(&scope, "my bank pin is 1234")).await;
    assert_eq!(
        outcome(&response),
        v1::RememberOutcome::SkippedMemoryDisabled
    );
    assert!(response.memory.is_none());
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);

    update_setting(&mut sandbox, &scope, Setting::MemoryEnabled(true)).await;
    let response = sandbox
        .ingest
        .remember(remember(&scope, "the build box is slow"))
        .await
        .unwrap();
    assert_eq!(outcome(response.get_ref()), v1::RememberOutcome::Created);
    let settings = space_settings(&mut sandbox, &scope).await;
    assert!(settings.memory_enabled);
    assert_eq!(settings.effective_soft_cap, 200, "the global default");
    assert_eq!(settings.memory_count, 1);
}

#[tokio::test]
async fn incognito_conversations_store_nothing() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = Uuid::new_v4().to_string();
    let started = sandbox
        .ingest
        .start_incognito(v1::StartIncognitoRequest {
            scope: Some(scope.clone()),
            conversation_id: conversation.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(started.incognito);
    let in_incognito = v1::RememberRequest {
        conversation_id: conversation.clone(),
        ..remember(&scope, "I'm planning a surprise party")
    };
    let response = remember_response(&mut sandbox, in_incognito.clone()).await;
    assert_eq!(outcome(&response), v1::RememberOutcome::SkippedIncognito);

    // Another conversation of the same space is not incognito.
    let elsewhere = v1::RememberRequest {
        conversation_id: Uuid::new_v4().to_string(),
        ..remember(&scope, "the build box is slow")
    };
    assert_eq!(
        outcome(sandbox.ingest.remember(elsewhere).await.unwrap().get_ref()),
        v1::RememberOutcome::Created
    );

    end_incognito(&mut sandbox, &scope, &conversation).await;
    assert_eq!(
        outcome(
            sandbox
                .ingest
                .remember(in_incognito)
                .await
                .unwrap()
                .get_ref()
        ),
        v1::RememberOutcome::Created
    );

    // incognito_default: new conversations start incognito; an explicit end overrides it.
    update_setting(&mut sandbox, &scope, Setting::IncognitoDefault(true)).await;
    let fresh = v1::RememberRequest {
        conversation_id: Uuid::new_v4().to_string(),
        ..remember(&scope, "the office plant needs water")
    };
    assert_eq!(
        outcome(sandbox.ingest.remember(fresh).await.unwrap().get_ref()),
        v1::RememberOutcome::SkippedIncognito
    );
    let ended = v1::RememberRequest {
        conversation_id: conversation.clone(),
        ..remember(&scope, "the printer on floor two jams")
    };
    assert_eq!(
        outcome(sandbox.ingest.remember(ended).await.unwrap().get_ref()),
        v1::RememberOutcome::Created
    );
}

#[tokio::test]
async fn every_user_action_is_audited_and_pages() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = Uuid::new_v4().to_string();
    let memory = remember_memory(&mut sandbox, &scope, "the build box is slow").await;
    sandbox
        .ingest
        .remember(remember(&scope, "The build box is slow!"))
        .await
        .unwrap();
    let id = || Some(scope.clone());
    sandbox
        .ingest
        .pin(v1::PinRequest {
            scope: id(),
            memory_id: memory.id.clone(),
        })
        .await
        .unwrap();
    sandbox
        .ingest
        .unpin(v1::UnpinRequest {
            scope: id(),
            memory_id: memory.id.clone(),
        })
        .await
        .unwrap();
    sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: id(),
            memory_id: memory.id.clone(),
        })
        .await
        .unwrap();
    update_setting(&mut sandbox, &scope, Setting::MemoryEnabled(false)).await;
    start_incognito(&mut sandbox, &scope, &conversation).await;
    end_incognito(&mut sandbox, &scope, &conversation).await;

    use v1::AuditAction::*;
    let expected_newest_first = vec![
        IncognitoEnd,
        IncognitoStart,
        SettingsChange,
        Forget,
        Unpin,
        Pin,
        Merge,
        Create,
    ];
    let all = sandbox
        .ingest
        .list_audit(v1::ListAuditRequest {
            scope: id(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(audit_actions(&all.events), expected_newest_first);
    assert!(all.next_page_token.is_empty());
    let settings_change = &all.events[2];
    let detail: serde_json::Value = serde_json::from_str(&settings_change.detail_json).unwrap();
    assert_eq!(detail["before"]["memory_enabled"], true);
    assert_eq!(detail["after"]["memory_enabled"], false);

    // Paging walks the same events, three at a time.
    let mut paged = Vec::new();
    let mut token = String::new();
    loop {
        let page = sandbox
            .ingest
            .list_audit(v1::ListAuditRequest {
                scope: id(),
                page_size: 3,
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        paged.extend(audit_actions(&page.events));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(paged, expected_newest_first);

    // Another space's trail is its own.
    let other = sandbox
        .ingest
        .list_audit(v1::ListAuditRequest {
            scope: Some(new_scope("work")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(other.events.is_empty());
}

#[tokio::test]
async fn every_pin_is_audited_once_however_it_is_made() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let key = remember_memory(&mut sandbox, &scope, "the spare key is under the blue pot").await;
    // A repeat that asks for a pin pins the entry it merges into: a merge and a pin.
    for _ in 0..2 {
        let merged = remember_response(
            &mut sandbox,
            v1::RememberRequest {
                pin: true,
                ..remember(&scope, "The spare key is under the blue pot!")
            },
        )
        .await;
        assert!(merged.memory.unwrap().pinned);
    }
    // Unpinning twice answers twice but changes, and audits, once.
    for _ in 0..2 {
        let unpinned = sandbox
            .ingest
            .unpin(v1::UnpinRequest {
                scope: Some(scope.clone()),
                memory_id: key.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!unpinned.memory.unwrap().pinned);
    }
    // A new entry written pinned: a create and a pin.
    sandbox
        .ingest
        .remember(v1::RememberRequest {
            pin: true,
            ..remember(&scope, "my locker code is 4411")
        })
        .await
        .unwrap();

    use v1::AuditAction::*;
    let events = crate::helpers::audit(&mut sandbox, &scope).await;
    assert_eq!(
        audit_actions(&events),
        vec![Pin, Create, Unpin, Merge, Pin, Merge, Create]
    );
    crate::helpers::assert_retention_in_step(&sandbox.pool).await;
}

#[tokio::test]
async fn repeating_a_setting_or_an_incognito_switch_adds_no_audit_event() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = Uuid::new_v4().to_string();
    for _ in 0..2 {
        update_setting(&mut sandbox, &scope, Setting::MemoryEnabled(false)).await;
        start_incognito(&mut sandbox, &scope, &conversation).await;
    }
    use v1::AuditAction::*;
    let events = crate::helpers::audit(&mut sandbox, &scope).await;
    assert_eq!(audit_actions(&events), vec![IncognitoStart, SettingsChange]);
    assert!(!space_settings(&mut sandbox, &scope).await.memory_enabled);
}
