//! The turn search reads the space's closed turns from their blocks and ranks them in the
//! service (issue 41). It must find what the statement before it found, over every state a
//! turn can be in: closed with its episode, closed without one (forgotten), open, deleted by
//! retention, redacted, in a conversation gone incognito, with and without turn vectors. The
//! statement before it is kept as the reference (`find_turns_reference`, the store's
//! `reference` feature), and this test compares the two.

use chrono::Utc;
use engram_e2e::Sandbox;
use engram_proto::v1;
use engram_store::retrieval::Bm25;
use engram_store::turn_search::{
    FoundTurns, TurnHit, TurnSearch, find_turns, find_turns_reference,
};
use uuid::Uuid;

use crate::conversations::{Chat, append_sessions, user, wait_until_segmented};
use crate::helpers::entries;

const MODEL: &str = "test-turn-vectors";

/// A unit vector of its own for each text (a hash seeds it), so cosines are spread out.
fn turn_vector(text: &str) -> Vec<f32> {
    let mut state = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut vector: Vec<f32> = (0..384)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        })
        .collect();
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    vector.iter_mut().for_each(|x| *x /= norm);
    vector
}

/// Gives every turn of the space a turn vector of the test's model (replacing the embedder's).
async fn store_turn_vectors(sandbox: &Sandbox, scope: &v1::Scope) {
    let turns: Vec<(Uuid, i32, String)> = sqlx::query_as(
        "SELECT conversation_id, turn_index, content FROM conversation_turns \
         WHERE user_id = $1::uuid AND space = $2",
    )
    .bind(&scope.user_id)
    .bind(&scope.space)
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    for (conversation, turn_index, content) in turns {
        sqlx::query(
            "INSERT INTO conversation_turn_embeddings \
                 (user_id, space, conversation_id, turn_index, model, embedding) \
             VALUES ($1::uuid, $2, $3, $4, $5, $6) \
             ON CONFLICT (user_id, space, conversation_id, turn_index) \
             DO UPDATE SET model = EXCLUDED.model, embedding = EXCLUDED.embedding",
        )
        .bind(&scope.user_id)
        .bind(&scope.space)
        .bind(conversation)
        .bind(turn_index)
        .bind(MODEL)
        .bind(pgvector::Vector::from(turn_vector(&content)))
        .execute(&sandbox.pool)
        .await
        .unwrap();
    }
}

/// The two searches agree: the same turns with the same contents and episodes, the same word
/// hits with the same BM25 scores, the same nearest turns with cosines equal to the half
/// precision of the stored vectors.
fn assert_same(blocks: &FoundTurns, reference: &FoundTurns, what: &str) {
    assert_eq!(blocks.stored, reference.stored, "{what}: the turns shown");
    assert_same_hits(
        &blocks.hits,
        &reference.hits,
        1e-9,
        &format!("{what}: word hits"),
    );
    assert_same_hits(
        &blocks.nearest,
        &reference.nearest,
        2e-3,
        &format!("{what}: nearest turns"),
    );
}

/// The same turns in the same order, with scores within `tolerance`.
fn assert_same_hits(ours: &[TurnHit], theirs: &[TurnHit], tolerance: f64, what: &str) {
    let keys = |hits: &[TurnHit]| hits.iter().map(|hit| hit.turn).collect::<Vec<_>>();
    assert_eq!(keys(ours), keys(theirs), "{what}");
    for (ours, theirs) in ours.iter().zip(theirs) {
        assert!(
            (ours.score - theirs.score).abs() < tolerance,
            "{what}: score {} vs {}",
            ours.score,
            theirs.score
        );
    }
}

#[tokio::test]
async fn the_block_search_finds_what_the_statement_over_every_turn_found() {
    let mut sandbox = Sandbox::start().await;
    let trip = Chat::new("blocks");
    let scope = trip.scope.clone();
    // Three closed sessions, one long enough to span two blocks.
    let planning: &[&str] = &[
        "We are planning a trip to Japan for our anniversary in April.",
        "Lovely! How long will you stay?",
        "Five nights in Kyoto, then three in Tokyo.",
        "Kyoto in April means cherry blossoms, book early.",
        "My wife Sofia doesn't eat raw fish, so no sushi dinners.",
        "Noted, I will suggest tempura and soba places instead.",
        "Our budget is about 6000 euros for everything.",
        "That is comfortable for eight nights.",
    ];
    let mut long_session: Vec<String> = Vec::new();
    for day in 0..15 {
        long_session.push(format!(
            "On day {day} of the training plan I ran {} kilometres along the river.",
            day + 3
        ));
        long_session.push(format!(
            "Good pace on day {day}; keep the knee warm and stretch afterwards."
        ));
    }
    long_session.push("My physio is called Marta Lopes and she sees me on Tuesdays.".to_owned());
    long_session.push("Tuesdays with Marta, noted.".to_owned());
    let training: Vec<&str> = long_session.iter().map(String::as_str).collect();
    let booking: &[&str] = &[
        "We booked the ryokan in Kyoto, Hiiragiya, from April 10 to 15.",
        "Wonderful choice, it is a classic.",
        "We dropped Tokyo and added two nights in Kanazawa instead.",
        "Kanazawa has a lovely garden, Kenroku-en.",
    ];
    append_sessions(
        &mut sandbox,
        &trip,
        &[(40, planning), (30, &training), (20, booking)],
    )
    .await;
    let last_closed = 8 + 32 + 4 - 1;
    wait_until_segmented(&mut sandbox, &trip, last_closed).await;
    // An open segment after them.
    let yesterday = Utc::now() - chrono::Duration::days(1);
    trip.append(
        &mut sandbox,
        vec![
            user(
                "Can you suggest restaurants in Kyoto for our trip?",
                yesterday,
            ),
            user("Something vegetarian would suit Sofia best.", yesterday),
        ],
    )
    .await;
    // A second conversation of the space, closed, then gone incognito.
    let hidden = Chat {
        scope: scope.clone(),
        id: Uuid::new_v4().to_string(),
    };
    append_sessions(
        &mut sandbox,
        &hidden,
        &[(
            10,
            &[
                "My knee hurt after the Kyoto walk, I took ibuprofen.",
                "Rest it and ice it tonight.",
            ],
        )],
    )
    .await;
    wait_until_segmented(&mut sandbox, &hidden, 1).await;

    // Retention deleted the first turns of the long session; a redaction rewrote a line; the
    // episode of the booking session was forgotten (its turns stay, with no episode to hold
    // them); the second conversation went incognito.
    let trip_id: Uuid = trip.id.parse().unwrap();
    sqlx::query(
        "DELETE FROM conversation_turns WHERE user_id = $1::uuid AND space = $2 \
         AND conversation_id = $3 AND turn_index BETWEEN 8 AND 11",
    )
    .bind(&scope.user_id)
    .bind(&scope.space)
    .bind(trip_id)
    .execute(&sandbox.pool)
    .await
    .unwrap();
    let mut redaction = engram_store::begin(&sandbox.pool).await.unwrap();
    sqlx::query("SELECT set_config('engram.redacting', 'on', true)")
        .execute(&mut *redaction)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE conversation_turns SET content = 'Our budget is [forgotten].' \
         WHERE user_id = $1::uuid AND space = $2 AND conversation_id = $3 AND turn_index = 6",
    )
    .bind(&scope.user_id)
    .bind(&scope.space)
    .bind(trip_id)
    .execute(&mut *redaction)
    .await
    .unwrap();
    redaction.commit().await.unwrap();
    let booking = entries(&mut sandbox, &scope)
        .await
        .into_iter()
        .find(|m| {
            m.kind() == v1::MemoryKind::Episodic
                && m.messages
                    .iter()
                    .any(|line| line.content.contains("Hiiragiya"))
        })
        .expect("the booking session's episode");
    sandbox
        .ingest
        .forget(v1::ForgetRequest {
            scope: Some(scope.clone()),
            memory_id: booking.id.clone(),
        })
        .await
        .unwrap();
    sqlx::query(
        "UPDATE conversations SET incognito = true \
         WHERE user_id = $1::uuid AND space = $2 AND conversation_id = $3",
    )
    .bind(&scope.user_id)
    .bind(&scope.space)
    .bind(hidden.id.parse::<Uuid>().unwrap())
    .execute(&sandbox.pool)
    .await
    .unwrap();

    let store_scope = engram_core::Scope::parse("scope", &scope.user_id, &scope.space).unwrap();
    let queries = [
        "Which restaurants would suit my wife?",
        "Where are we staying in Kyoto and when?",
        "Which cities are we visiting?",
        "What is our trip budget?",
        "Who is my physiotherapist?",
        "How far did I run on day 2 of the training plan?",
        "What did I take for my knee?",
        "kilometres river knee",
        "nothing matches this zebra",
    ];
    let mut compared = 0;
    for with_vectors in [false, true] {
        if with_vectors {
            store_turn_vectors(&sandbox, &scope).await;
        }
        for query in queries {
            let query_vector = turn_vector(query);
            for (radius, limit, nearest_limit) in [(0, 5, 3), (2, 20, 6)] {
                let search = TurnSearch {
                    bm25: Bm25 { k1: 1.2, b: 0.75 },
                    turn_vector: with_vectors.then_some((MODEL, query_vector.as_slice())),
                    limit,
                    nearest_limit,
                    radius,
                    include_inactive: false,
                };
                let blocks = find_turns(&sandbox.pool, &store_scope, query, search)
                    .await
                    .unwrap();
                let reference = find_turns_reference(&sandbox.pool, &store_scope, query, search)
                    .await
                    .unwrap();
                let what = format!("{query:?}, radius {radius}, vectors {with_vectors}");
                assert_same(&blocks, &reference, &what);
                compared += usize::from(!reference.stored.is_empty());
            }
        }
    }
    // Most of the searches found something, so the comparison is not of empty answers.
    assert!(compared >= 20, "only {compared} searches found turns");

    // The blocks hold what the turns hold, no more: not the redacted budget, not the deleted
    // turns, and every closed turn left.
    let (in_blocks, redacted, deleted): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT coalesce(sum(cardinality(turn_indexes)), 0) FROM conversation_turn_blocks \
                 WHERE user_id = $1::uuid), \
                (SELECT count(*) FROM conversation_turn_blocks \
                 WHERE user_id = $1::uuid AND array_to_string(contents, ' ') LIKE '%6000 euros%'), \
                (SELECT count(*) FROM conversation_turn_blocks \
                 WHERE user_id = $1::uuid AND conversation_id = $2 AND turn_indexes && ARRAY[8, 9, 10, 11])",
    )
    .bind(&scope.user_id)
    .bind(trip_id)
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    let closed_turns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_turns t JOIN conversations c USING (user_id, space, conversation_id) \
         WHERE t.user_id = $1::uuid AND t.turn_index <= c.segmented_through",
    )
    .bind(&scope.user_id)
    .fetch_one(&sandbox.pool)
    .await
    .unwrap();
    assert_eq!((in_blocks, redacted, deleted), (closed_turns, 0, 0));
}
