//! What an LLM answers is taken in as a user's text is: NUL and the other controls removed,
//! lengths and counts within what a client may send. An answer that cannot be read (too large)
//! or cannot be stored falls back to the local rules for that segment, once: the conversation is
//! segmented, and the LLM is not asked again and again.

use std::time::Duration;

use chrono::Utc;
use engram_e2e::{Sandbox, SandboxOptions};
use engram_proto::v1;
use engram_testkit::{FakeAnswer, FakeLlm};
use serde_json::{Value, json};

use crate::conversations::{Chat, assistant, user};

/// Characters of an episode's title at most: an imported title's limit.
const MAX_TITLE_CHARS: usize = 512;
/// Characters of a memory's text at most (the default `memory.max_text_chars`).
const MAX_TEXT_CHARS: usize = 8_192;
/// Characters of a tag at most, as a client's tags.
const MAX_TAG_CHARS: usize = 64;
/// Facts one segment's answer may establish.
const MAX_FACTS_PER_SEGMENT: usize = 50;

/// A short session worth an episode, said an hour ago.
fn session() -> Vec<v1::ConversationMessage> {
    let at = Utc::now() - chrono::Duration::hours(1);
    let minutes = chrono::Duration::minutes;
    vec![
        user(
            "We are moving the deploys to Friday afternoons from now on.",
            at,
        ),
        assistant(
            "Noted: deploys on Friday afternoons, after the release call.",
            at + minutes(1),
        ),
        user(
            "Good. And I prefer tea over coffee during release calls.",
            at + minutes(2),
        ),
    ]
}

/// An answer of the `segment_episode` schema.
fn described(title: &str, summary: &str, facts: &[String], entities: &[String]) -> Value {
    json!({
        "title": title,
        "summary": summary,
        "surprise": 0.5,
        "established": {
            "facts": facts, "preferences": [], "decisions": [], "todos": [], "goals": [],
            "entities": entities
        }
    })
}

/// A sandbox whose LLM describes every segment with `answer` (and judges no conflicts).
async fn sandbox_answering(llm: &FakeLlm, answer: FakeAnswer) -> Sandbox {
    llm.set_responder(move |request| {
        if request["response_format"]["json_schema"]["name"] == "segment_episode" {
            answer.clone()
        } else {
            FakeAnswer::Json(json!({"superseded": []}))
        }
    });
    Sandbox::start_with(SandboxOptions {
        llm_base_url: Some(llm.base_url()),
        ..Default::default()
    })
    .await
}

/// How often the LLM was asked to describe a segment.
fn descriptions_asked(llm: &FakeLlm) -> usize {
    llm.requests()
        .iter()
        .filter(|request| request["response_format"]["json_schema"]["name"] == "segment_episode")
        .count()
}

/// Every entry of the space (up to 500).
async fn all_entries(sandbox: &mut Sandbox, scope: &v1::Scope) -> Vec<v1::Memory> {
    sandbox
        .retrieval
        .list_entries(v1::ListEntriesRequest {
            scope: Some(scope.clone()),
            page_size: 500,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries
}

/// Says the session, closes its segment and waits for its episode, consolidated; returns the
/// episode and the space's valid facts.
async fn episode_and_facts(sandbox: &mut Sandbox, chat: &Chat) -> (v1::Memory, Vec<v1::Memory>) {
    chat.append(sandbox, session()).await;
    chat.close(sandbox).await;
    let episode = chat.wait_for_episodes(sandbox, 1).await.remove(0);
    chat.wait_for_consolidation(sandbox).await;
    let facts = all_entries(sandbox, &chat.scope)
        .await
        .into_iter()
        .filter(|m| m.kind() == v1::MemoryKind::Semantic && m.invalid_at.is_none())
        .collect();
    assert_eq!(chat.state(sandbox).await.segmented_through, 2);
    (episode, facts)
}

/// Who described the space's episode, from its audit.
async fn described_by(sandbox: &mut Sandbox, scope: &v1::Scope) -> String {
    let audit = crate::helpers::audit(sandbox, scope).await;
    let created = audit
        .iter()
        .find(|e| e.action() == v1::AuditAction::Create && e.detail_json.contains("described_by"))
        .expect("the episode's creation is audited");
    let detail: Value = serde_json::from_str(&created.detail_json).unwrap();
    detail["described_by"].as_str().unwrap().to_owned()
}

/// A NUL in every text of the answer (Postgres refuses it: "invalid byte sequence 0x00"): the
/// NULs are removed as from a user's text, the episode and its facts are stored, the LLM was
/// asked once.
#[tokio::test]
async fn llm_answer_with_nul_is_stored_cleaned_and_asked_once() {
    let llm = FakeLlm::start().await;
    let mut sandbox = sandbox_answering(
        &llm,
        FakeAnswer::Json(described(
            "Friday\u{0} deploys",
            "The user moves the deploys\u{0} to Friday afternoons.",
            &["The user deploys on Friday\u{0} afternoons.".into()],
            &["Release\u{0} call".into()],
        )),
    )
    .await;
    let chat = Chat::new("nul");
    let (episode, facts) = episode_and_facts(&mut sandbox, &chat).await;
    assert_eq!(episode.title, "Friday deploys");
    assert_eq!(
        episode.text,
        "The user moves the deploys to Friday afternoons."
    );
    let structured = episode.structured_summary.as_ref().unwrap();
    assert_eq!(structured.entities, ["Release call"]);
    assert_eq!(structured.facts, ["The user deploys on Friday afternoons."]);
    assert!(
        episode.tags.contains(&"release call".to_owned()),
        "{:?}",
        episode.tags
    );
    let texts: Vec<&str> = facts.iter().map(|f| f.text.as_str()).collect();
    assert_eq!(texts, ["The user deploys on Friday afternoons."]);
    assert_eq!(described_by(&mut sandbox, &chat.scope).await, "llm");
    assert_eq!(descriptions_asked(&llm), 1);
    assert_eq!(
        sandbox.ingest_metrics.conversation_counts().llm_fallbacks,
        0
    );
}

/// An answer Postgres refuses to store (SQLSTATE 22021, as for a NUL): the segment is written
/// once more, described by the local rules, and the LLM is not asked again. Cleaning leaves no
/// NUL to refuse, so a trigger plays the part of any value Postgres cannot take.
#[tokio::test]
async fn llm_answer_the_store_refuses_falls_back_to_the_local_rules_once() {
    let llm = FakeLlm::start().await;
    let mut sandbox = sandbox_answering(
        &llm,
        FakeAnswer::Json(described(
            "Unstorable title",
            "The user moves the deploys to Friday afternoons.",
            &["The user deploys on Friday afternoons.".into()],
            &[],
        )),
    )
    .await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_unstorable() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF NEW.title = 'Unstorable title' THEN \
             RAISE EXCEPTION 'invalid byte sequence for encoding \"UTF8\": 0x00' \
               USING ERRCODE = '22021'; \
           END IF; \
           RETURN NEW; \
         END $$; \
         CREATE TRIGGER refuse_unstorable BEFORE INSERT OR UPDATE ON memories \
           FOR EACH ROW EXECUTE FUNCTION refuse_unstorable();",
    )
    .execute(&sandbox.pool)
    .await
    .unwrap();
    let chat = Chat::new("refused");
    let (episode, _) = episode_and_facts(&mut sandbox, &chat).await;
    assert_ne!(episode.title, "Unstorable title");
    assert_eq!(described_by(&mut sandbox, &chat.scope).await, "extractive");
    assert_eq!(
        sandbox.ingest_metrics.conversation_counts().llm_fallbacks,
        1
    );
    // Sweeps run every 100 ms: none asks again for the segment written.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(descriptions_asked(&llm), 1);
}

/// A title of 100,000 characters and a summary of 1 MiB: cut at a word to an imported title's
/// and a memory text's limits, and said to be cut ("…").
#[tokio::test]
async fn llm_answer_of_absurd_length_is_cut_to_the_limits() {
    let llm = FakeLlm::start().await;
    let title = "Friday deploys ".repeat(100_000 / 15);
    let summary = "The user deploys on Friday afternoons. ".repeat(1_048_576 / 39);
    assert!(title.chars().count() >= 100_000 - 15 && summary.len() >= 1_048_576 - 39);
    let mut sandbox = sandbox_answering(
        &llm,
        FakeAnswer::Json(described(&title, &summary, &[], &[])),
    )
    .await;
    let chat = Chat::new("absurd");
    let (episode, _) = episode_and_facts(&mut sandbox, &chat).await;
    assert!(episode.title.chars().count() <= MAX_TITLE_CHARS);
    assert!(
        episode.title.starts_with("Friday deploys Friday") && episode.title.ends_with('…'),
        "{}",
        episode.title
    );
    assert!(episode.text.chars().count() <= MAX_TEXT_CHARS);
    assert!(
        episode.text.starts_with("The user deploys") && episode.text.ends_with('…'),
        "{}",
        episode.text
    );
    assert_eq!(described_by(&mut sandbox, &chat.scope).await, "llm");
}

/// 2,000 facts from one segment: at most 50 are kept (in the episode's structured summary and
/// as memories), the rest never reach the store.
#[tokio::test]
async fn llm_answer_with_2000_facts_is_capped() {
    let llm = FakeLlm::start().await;
    let facts: Vec<String> = (0..2_000)
        .map(|n| format!("The user keeps deploy checklist item {n} in the wiki."))
        .collect();
    let mut sandbox = sandbox_answering(
        &llm,
        FakeAnswer::Json(described(
            "Deploy checklist",
            "The user keeps a long deploy checklist.",
            &facts,
            &[],
        )),
    )
    .await;
    let chat = Chat::new("flood");
    let (episode, stored) = episode_and_facts(&mut sandbox, &chat).await;
    let structured = episode.structured_summary.as_ref().unwrap();
    assert_eq!(structured.facts.len(), MAX_FACTS_PER_SEGMENT);
    assert_eq!(structured.facts[..], facts[..MAX_FACTS_PER_SEGMENT]);
    // Near-duplicates among them may merge; none beyond the cap is written.
    assert!(
        (1..=MAX_FACTS_PER_SEGMENT).contains(&stored.len()),
        "{} facts stored",
        stored.len()
    );
    assert!(
        stored
            .iter()
            .all(|fact| facts[..MAX_FACTS_PER_SEGMENT].contains(&fact.text))
    );
}

/// Entities longer than a client's tags may be (208 characters against 64) are left out of the
/// episode's structured summary and its tags; the others stay.
#[tokio::test]
async fn llm_answer_with_long_entities_keeps_tags_within_the_tag_limit() {
    let llm = FakeLlm::start().await;
    let long = "Acme Robotics Perception ".repeat(9).trim().to_owned();
    assert!(long.chars().count() >= 208);
    let mut sandbox = sandbox_answering(
        &llm,
        FakeAnswer::Json(described(
            "Friday deploys",
            "The user moves the deploys to Friday afternoons.",
            &[],
            &[
                long.clone(),
                "Alice Chen".into(),
                "x".repeat(MAX_TAG_CHARS + 1),
            ],
        )),
    )
    .await;
    let chat = Chat::new("entities");
    let (episode, _) = episode_and_facts(&mut sandbox, &chat).await;
    let structured = episode.structured_summary.as_ref().unwrap();
    assert_eq!(structured.entities, ["Alice Chen"]);
    assert!(
        episode.tags.contains(&"alice chen".to_owned()),
        "{:?}",
        episode.tags
    );
    assert!(
        episode
            .tags
            .iter()
            .all(|tag| tag.chars().count() <= MAX_TAG_CHARS),
        "{:?}",
        episode.tags
    );
}

/// An LLM answering 5 MiB (beyond `llm.max_response_bytes`, 4 MiB by default): neither service
/// reads it whole; segmentation describes the segment by the local rules, grading grades
/// locally, each after one fresh attempt.
#[tokio::test]
async fn llm_answer_beyond_the_response_cap_falls_back_in_both_services() {
    let llm = FakeLlm::start().await;
    let huge = FakeAnswer::Json(described("Huge", &"x".repeat(5 * 1024 * 1024), &[], &[]));
    let answer = huge.clone();
    llm.set_responder(move |_| answer.clone());
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        llm_base_url: Some(llm.base_url()),
        ..Default::default()
    })
    .await;
    let chat = Chat::new("huge");
    let (episode, _) = episode_and_facts(&mut sandbox, &chat).await;
    assert_ne!(episode.title, "Huge");
    assert_eq!(described_by(&mut sandbox, &chat.scope).await, "extractive");
    assert_eq!(
        descriptions_asked(&llm),
        2,
        "asked again once, then the rules"
    );
    assert_eq!(
        sandbox.ingest_metrics.conversation_counts().llm_fallbacks,
        1
    );

    let graded = sandbox
        .review
        .grade_memories(v1::GradeMemoriesRequest {
            scope: Some(chat.scope.clone()),
            context: vec![v1::Message {
                role: v1::SpeakerRole::Assistant.into(),
                content: "Deploys are on Friday afternoons now.".into(),
            }],
            memories: vec![v1::MemoryToGrade {
                memory_id: episode.id.clone(),
                queries: vec!["when do we deploy".into()],
            }],
            dry_run: true,
            grader: v1::Grader::Llm.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(graded.graded[0].graded_by, "local: the LLM failed");
    assert_eq!(sandbox.review_metrics.counts().llm_fallbacks, 1);
}

/// Issue 39 part 7: the LLM's items keep the local rules' contract. Each cites the turn that
/// said it and holds from that turn's time (not the episode's end); experiences and guidelines
/// come in lists of their own with their categories; a list the answer leaves out is empty, and
/// an item without a turn holds from the episode's end.
#[tokio::test]
async fn llm_items_hold_from_the_turn_they_cite_with_their_kind() {
    let llm = FakeLlm::start().await;
    let answer = json!({
        "title": "Friday deploys",
        "summary": "The user moved deploys to Friday afternoons.",
        "surprise": 0.4,
        "established": {
            "facts": [{"text": "The user's team deploys on Friday afternoons.", "turn": 1}],
            "preferences": [{"text": "The user prefers tea over coffee during release calls.", "turn": 3}],
            "guidelines": [{"text": "Keep release notes to three bullet points.", "turn": 1}],
            "experiences": ["The user ran the last release call."],
            "entities": ["Friday"]
        }
    });
    let mut sandbox = sandbox_answering(&llm, FakeAnswer::Json(answer)).await;
    let chat = Chat::new("llm-contract");
    let (episode, facts) = episode_and_facts(&mut sandbox, &chat).await;
    let time = |t: &Option<prost_types::Timestamp>| {
        engram_server::time::from_proto("at", t.as_ref().expect("a time")).unwrap()
    };
    let find = |needle: &str| {
        facts
            .iter()
            .find(|m| m.text.contains(needle))
            .unwrap_or_else(|| panic!("{needle:?} among {facts:?}"))
    };
    let (start, end) = (time(&episode.start_at), time(&episode.end_at));
    let deploys = find("deploys on Friday");
    assert_eq!(
        time(&deploys.valid_at),
        start,
        "from the first turn, which it cites"
    );
    assert_eq!(deploys.category(), v1::Category::Fact);
    let guideline = find("three bullet points");
    assert_eq!(guideline.category(), v1::Category::Guideline);
    assert_eq!(time(&guideline.valid_at), start);
    let tea = find("tea over coffee");
    assert_eq!(tea.category(), v1::Category::Preference);
    assert_eq!(time(&tea.valid_at), end, "the third turn is the last");
    let release = find("release call.");
    assert_eq!(release.category(), v1::Category::Experience);
    assert_eq!(
        time(&release.valid_at),
        end,
        "no turn cited: the episode's end"
    );
    assert_eq!(described_by(&mut sandbox, &chat.scope).await, "llm");
    // The LLM was shown the turns numbered, and asked for every list.
    let asked = llm
        .requests()
        .into_iter()
        .find(|r| r["response_format"]["json_schema"]["name"] == "segment_episode")
        .expect("asked");
    let shown = asked["messages"][1]["content"].as_str().unwrap_or_default();
    assert!(shown.contains("[1] user"), "{shown}");
    let required =
        &asked["response_format"]["json_schema"]["schema"]["properties"]["established"]["required"];
    for list in ["experiences", "guidelines"] {
        assert!(
            required.as_array().unwrap().iter().any(|r| r == list),
            "{required}"
        );
    }
}
