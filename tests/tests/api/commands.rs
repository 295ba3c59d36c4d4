//! ApplyCommand: natural-language memory controls, English and Chinese.

use engram_e2e::Sandbox;
use engram_proto::v1;
use uuid::Uuid;

use crate::helpers::{
    Setting, audit, end_incognito, new_scope, remember, start_incognito, update_setting,
};

fn command(scope: &v1::Scope, conversation: &str, message: &str) -> v1::ApplyCommandRequest {
    v1::ApplyCommandRequest {
        scope: Some(scope.clone()),
        conversation_id: conversation.to_owned(),
        message: message.to_owned(),
    }
}

fn action(response: &v1::ApplyCommandResponse) -> v1::CommandAction {
    v1::CommandAction::try_from(response.action).unwrap()
}

/// One conversation of one space, spoken to through ApplyCommand.
struct Chat {
    client: engram_proto::v1::ingest_service_client::IngestServiceClient<tonic::transport::Channel>,
    scope: v1::Scope,
    conversation: String,
}

impl Chat {
    fn new(sandbox: &Sandbox, scope: &v1::Scope) -> Self {
        Self {
            client: sandbox.ingest.clone(),
            scope: scope.clone(),
            conversation: Uuid::new_v4().to_string(),
        }
    }

    async fn say(&mut self, message: &str) -> v1::ApplyCommandResponse {
        let request = command(&self.scope, &self.conversation, message);
        self.client
            .apply_command(request)
            .await
            .unwrap()
            .into_inner()
    }

    /// Says `message`, which must save a memory, and returns that memory.
    async fn save(&mut self, message: &str) -> v1::Memory {
        self.say(message)
            .await
            .memory
            .unwrap_or_else(|| panic!("{message:?} saved nothing"))
    }

    /// "forget that" and "pin this" both do nothing, with a reply that mentions `why`.
    async fn refuses_forget_and_pin(&mut self, why: &str) {
        for message in ["forget that", "pin this"] {
            let refused = self.say(message).await;
            assert!(!refused.applied, "{message}");
            assert!(refused.reply.contains(why), "{}", refused.reply);
        }
    }

    /// Something saved now is "that" again: "forget that" deletes exactly it.
    async fn forget_that_takes_a_new_save(&mut self) {
        let gate = self.save("Remember: the gate code is 4411").await;
        let forgotten = self.say("forget that").await;
        assert!(forgotten.applied);
        assert_eq!(forgotten.memory.unwrap().id, gate.id);
    }
}

/// The space holds `memory` and nothing else; returns its current state.
async fn only_entry_left(
    sandbox: &mut Sandbox,
    scope: &v1::Scope,
    memory: &v1::Memory,
) -> v1::Memory {
    let mut left = crate::helpers::entries(sandbox, scope).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].id, memory.id);
    left.remove(0)
}

async fn memory_count(sandbox: &Sandbox) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&sandbox.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn remember_pin_and_forget_by_saying_so() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = Uuid::new_v4().to_string();

    let saved = sandbox
        .ingest
        .apply_command(command(
            &scope,
            &conversation,
            "Please remember that my flight to Lisbon is on Friday.",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(action(&saved), v1::CommandAction::Remember);
    assert!(saved.applied);
    assert_eq!(
        v1::RememberOutcome::try_from(saved.remember_outcome).unwrap(),
        v1::RememberOutcome::Created
    );
    let memory = saved.memory.unwrap();
    assert_eq!(memory.text, "my flight to Lisbon is on Friday");
    assert!(memory.manually_saved);

    // A later memory written in another conversation is not "that".
    sandbox
        .ingest
        .remember(v1::RememberRequest {
            conversation_id: Uuid::new_v4().to_string(),
            ..remember(&scope, "the build box is slow")
        })
        .await
        .unwrap();

    let pinned = sandbox
        .ingest
        .apply_command(command(&scope, &conversation, "pin this"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(action(&pinned), v1::CommandAction::Pin);
    assert!(pinned.applied);
    assert_eq!(pinned.memory.as_ref().unwrap().id, memory.id);
    assert!(pinned.memory.unwrap().pinned);

    let forgotten = sandbox
        .ingest
        .apply_command(command(&scope, &conversation, "forget that"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(action(&forgotten), v1::CommandAction::Forget);
    assert!(forgotten.applied);
    assert_eq!(forgotten.memory.unwrap().id, memory.id);
    assert_eq!(
        memory_count(&sandbox).await,
        1,
        "only the other conversation's memory remains"
    );

    // Nothing left from this conversation: the command is recognised but not applied.
    let again = sandbox
        .ingest
        .apply_command(command(&scope, &conversation, "forget that"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(action(&again), v1::CommandAction::Forget);
    assert!(!again.applied);
    assert_eq!(memory_count(&sandbox).await, 1);
}

#[tokio::test]
async fn memory_and_incognito_switches_in_english_and_chinese() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = Uuid::new_v4().to_string();
    let settings = |sandbox: &mut Sandbox| {
        let mut client = sandbox.ingest.clone();
        let scope = scope.clone();
        async move {
            client
                .get_settings(v1::GetSettingsRequest { scope: Some(scope) })
                .await
                .unwrap()
                .into_inner()
                .settings
                .unwrap()
        }
    };

    for (message, expected, enabled) in [
        ("turn memory off", v1::CommandAction::MemoryOff, false),
        ("打开记忆", v1::CommandAction::MemoryOn, true),
        ("关闭记忆", v1::CommandAction::MemoryOff, false),
        (
            "Turn memory back on, please",
            v1::CommandAction::MemoryOn,
            true,
        ),
    ] {
        let response = sandbox
            .ingest
            .apply_command(command(&scope, &conversation, message))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(action(&response), expected, "{message}");
        assert_eq!(
            settings(&mut sandbox).await.memory_enabled,
            enabled,
            "{message}"
        );
    }

    let started = sandbox
        .ingest
        .apply_command(command(
            &scope,
            &conversation,
            "start incognito for this chat",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(action(&started), v1::CommandAction::IncognitoStart);
    let blocked = sandbox
        .ingest
        .apply_command(command(&scope, &conversation, "记住：我对花生过敏"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(action(&blocked), v1::CommandAction::Remember);
    assert!(!blocked.applied);
    assert_eq!(
        v1::RememberOutcome::try_from(blocked.remember_outcome).unwrap(),
        v1::RememberOutcome::SkippedIncognito
    );
    assert_eq!(memory_count(&sandbox).await, 0);

    let ended = sandbox
        .ingest
        .apply_command(command(&scope, &conversation, "退出无痕模式"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(action(&ended), v1::CommandAction::IncognitoEnd);
    let saved = sandbox
        .ingest
        .apply_command(command(&scope, &conversation, "记住：我对花生过敏"))
        .await
        .unwrap()
        .into_inner();
    assert!(saved.applied);
    assert_eq!(saved.memory.unwrap().text, "我对花生过敏");
    let pinned = sandbox
        .ingest
        .apply_command(command(&scope, &conversation, "置顶这条"))
        .await
        .unwrap()
        .into_inner();
    assert!(pinned.applied && pinned.memory.unwrap().pinned);
    let forgotten = sandbox
        .ingest
        .apply_command(command(&scope, &conversation, "忘掉这个"))
        .await
        .unwrap()
        .into_inner();
    assert!(forgotten.applied);
    assert_eq!(memory_count(&sandbox).await, 0);
}

#[tokio::test]
async fn ordinary_messages_are_no_command_and_change_nothing() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = Uuid::new_v4().to_string();
    sandbox
        .ingest
        .remember(v1::RememberRequest {
            conversation_id: conversation.clone(),
            ..remember(&scope, "the build box is slow")
        })
        .await
        .unwrap();
    let audit_before = audit(&mut sandbox, &scope).await.len();
    for message in [
        "I always forget that my keys are in the car",
        "what's the weather in Lisbon?",
        "我忘了带钥匙",
        // Talk about remembering, questions and acknowledgements are not "remember ...".
        "Remembering names is hard for me",
        "Remember when we went to Paris?",
        "remember that, thanks",
        "记住了",
        "记下了，谢谢",
        // Pointing back rather than saying what, "never mind", and nothing visible.
        "记住这个吧",
        "remember this one",
        "forget it",
        "Remember: \u{200b}",
    ] {
        let response = sandbox
            .ingest
            .apply_command(command(&scope, &conversation, message))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(action(&response), v1::CommandAction::NoCommand, "{message}");
        assert!(!response.applied);
        assert_eq!(response.reply, "no command");
    }
    let audit_after = audit(&mut sandbox, &scope).await.len();
    assert_eq!(audit_before, audit_after);
    assert_eq!(memory_count(&sandbox).await, 1);
}

#[tokio::test]
async fn a_repeated_forget_that_does_not_reach_back_to_older_memories() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let mut chat = Chat::new(&sandbox, &scope);
    let flight = chat
        .save("Remember that my flight to Lisbon is on Friday")
        .await;
    assert!(chat.say("pin this").await.applied);
    let events_after_pin = audit(&mut sandbox, &scope).await.len();
    let pinned_again = chat.say("pin this").await;
    assert!(
        pinned_again.applied,
        "pinning a pinned memory answers the same"
    );
    assert_eq!(
        audit(&mut sandbox, &scope).await.len(),
        events_after_pin,
        "and adds no audit event"
    );
    let coffee = chat.save("Please remember: I take my coffee black").await;

    let first = chat.say("forget that").await;
    assert!(first.applied);
    assert_eq!(first.memory.unwrap().id, coffee.id);

    // A retry, or the same words again: "that" is already gone, and the pinned flight stays.
    let again = chat.say("forget that").await;
    assert_eq!(action(&again), v1::CommandAction::Forget);
    assert!(!again.applied);
    assert!(again.reply.contains("already gone"), "{}", again.reply);
    let pin_again = chat.say("pin this").await;
    assert!(!pin_again.applied);
    assert!(only_entry_left(&mut sandbox, &scope, &flight).await.pinned);
}

#[tokio::test]
async fn forget_that_after_an_unsaved_remember_leaves_older_memories_alone() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let mut chat = Chat::new(&sandbox, &scope);
    let passport = chat
        .save("Remember that my passport number ends in 4471")
        .await;

    // Incognito: the next "remember" is not saved, so "that" is not the passport.
    assert!(chat.say("start incognito for this chat").await.applied);
    let party = chat
        .say("Remember that I am planning a surprise party for Ana")
        .await;
    assert!(!party.applied);
    chat.refuses_forget_and_pin("incognito").await;
    // Nor once incognito is over: nothing said since the last save was kept.
    assert!(chat.say("stop incognito").await.applied);
    let after_incognito = chat.say("forget that").await;
    assert!(!after_incognito.applied);

    // Memory off: the same.
    assert!(chat.say("turn memory off").await.applied);
    assert!(
        !chat
            .say("Remember that my sister's birthday is March 3")
            .await
            .applied
    );
    chat.refuses_forget_and_pin("Memory is off").await;
    assert!(chat.say("turn memory on").await.applied);

    assert!(
        !only_entry_left(&mut sandbox, &scope, &passport)
            .await
            .pinned
    );

    // Something saved after the switch is "that" again.
    chat.forget_that_takes_a_new_save().await;
}

#[tokio::test]
async fn forget_that_after_a_suppressed_remember_leaves_older_memories_alone() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    // Yesterday, outside this chat: the gym code was saved, then forgotten (a tombstone).
    let gym = sandbox
        .ingest
        .remember(remember(&scope, "The gym locker code is 1234"))
        .await
        .unwrap()
        .into_inner()
        .memory
        .unwrap();
    sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(scope.clone()),
            memory_id: gym.id.clone(),
        })
        .await
        .unwrap();

    let mut chat = Chat::new(&sandbox, &scope);
    let passport = chat
        .save("Remember that my passport number ends in 4471")
        .await;
    let suppressed = chat.say("Remember that the gym locker code is 1234").await;
    assert!(!suppressed.applied);
    assert_eq!(
        v1::RememberOutcome::try_from(suppressed.remember_outcome).unwrap(),
        v1::RememberOutcome::SuppressedByTombstone
    );
    // "That" is the gym code, which was not saved: the passport is neither deleted nor pinned.
    chat.refuses_forget_and_pin("not saved").await;
    assert!(
        !only_entry_left(&mut sandbox, &scope, &passport)
            .await
            .pinned
    );

    // The suppressed write is in the audit trail, with its conversation and without its text.
    let events = audit(&mut sandbox, &scope).await;
    let suppress = events
        .iter()
        .find(|event| event.action == v1::AuditAction::Suppress as i32)
        .expect("a suppress event");
    assert_eq!(suppress.conversation_id, chat.conversation);
    assert!(suppress.memory_id.is_empty());
    assert!(
        !suppress.detail_json.contains("1234"),
        "{}",
        suppress.detail_json
    );
    assert!(suppress.detail_json.contains("tombstone_expires_at"));

    // Something saved after it is "that" again.
    chat.forget_that_takes_a_new_save().await;
}

#[tokio::test]
async fn forget_that_after_a_switch_made_outside_the_chat_leaves_older_memories_alone() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let mut chat = Chat::new(&sandbox, &scope);
    let locker = chat.save("Remember that my locker code is 4411").await;
    // A soft-cap change is no privacy switch: "that" is still the locker code's entry.
    update_setting(&mut sandbox, &scope, Setting::SoftCap(500)).await;
    assert!(chat.say("pin this").await.applied);

    // Memory, then default incognito, switched off and on again by the platform, not in the
    // chat; what the user said in between was not saved.
    let switches = [
        (Setting::MemoryEnabled(false), Setting::MemoryEnabled(true)),
        (
            Setting::IncognitoDefault(true),
            Setting::IncognitoDefault(false),
        ),
    ];
    for (switch_off, switch_on) in switches {
        update_setting(&mut sandbox, &scope, switch_off).await;
        assert!(
            !chat
                .say("Remember that my sister is called Ana")
                .await
                .applied
        );
        update_setting(&mut sandbox, &scope, switch_on).await;
        let refused = chat.say("forget that").await;
        assert!(!refused.applied);
        assert!(
            refused.reply.contains("left older memories alone"),
            "{}",
            refused.reply
        );
    }
    only_entry_left(&mut sandbox, &scope, &locker).await;
}

#[tokio::test]
async fn incognito_is_audited_only_when_it_changes_the_conversation() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let conversation = Uuid::new_v4().to_string();
    // Never incognito (the space's default is off): ending it changes nothing.
    end_incognito(&mut sandbox, &scope, &conversation).await;
    assert!(audit(&mut sandbox, &scope).await.is_empty());

    // Incognito by the space's default: starting it changes nothing either.
    update_setting(&mut sandbox, &scope, Setting::IncognitoDefault(true)).await;
    let other = Uuid::new_v4().to_string();
    start_incognito(&mut sandbox, &scope, &other).await;
    let events = audit(&mut sandbox, &scope).await;
    assert_eq!(events.len(), 1, "only the settings change: {events:?}");

    // Leaving the default's incognito is a change, and is audited.
    end_incognito(&mut sandbox, &scope, &other).await;
    assert_eq!(audit(&mut sandbox, &scope).await.len(), 2);
}
