//! The soft cap: trimming the lowest total score, never pinned or saved entries.

use engram_e2e::{Sandbox, SandboxOptions};
use engram_proto::v1;

use crate::helpers::{
    Setting, audit, audit_actions, entries, import, imported_fact, new_scope, outcome, remember,
    remember_response, space_settings, update_setting,
};

#[tokio::test]
async fn exceeding_the_soft_cap_trims_the_lowest_scores_and_spares_pinned_entries() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    let settings = update_setting(&mut sandbox, &scope, Setting::SoftCap(3)).await;
    assert_eq!(settings.effective_soft_cap, 3);
    assert_eq!(settings.soft_cap_override, 3);

    let mut ids = Vec::new();
    for text in [
        "ok",
        "the build box is slow",
        "the office plant needs water",
        "I prefer tabs over spaces",
    ] {
        let response = remember_response(&mut sandbox, remember(&scope, text)).await;
        ids.push(response.memory.unwrap().id);
        if ids.len() == 4 {
            // Fourth write: one over the cap. "ok" is chit-chat (importance 0.2): the lowest total.
            assert_eq!(response.trimmed_ids, vec![ids[0].clone()]);
        } else {
            assert!(response.trimmed_ids.is_empty());
        }
    }
    // Make an old, unimportant entry and pin it: it would be the next victim, but it is protected.
    sqlx::query("UPDATE memories SET created_at = now() - interval '90 days', importance = 0, last_scores = NULL WHERE id = $1::uuid")
        .bind(&ids[1])
        .execute(&sandbox.pool)
        .await
        .unwrap();
    sandbox
        .ingest
        .pin(v1::PinRequest {
            scope: Some(scope.clone()),
            memory_id: ids[1].clone(),
        })
        .await
        .unwrap();
    // And make the next victim unambiguous: an entry of low importance, scores to be recomputed.
    sqlx::query("UPDATE memories SET importance = 0.1, last_scores = NULL WHERE id = $1::uuid")
        .bind(&ids[2])
        .execute(&sandbox.pool)
        .await
        .unwrap();
    let alerts_before = sandbox.ingest_metrics.pinned_trim_alerts();

    let response = remember_response(
        &mut sandbox,
        remember(&scope, "the printer on floor two jams"),
    )
    .await;
    assert_eq!(outcome(&response), v1::RememberOutcome::Created);
    assert_eq!(
        response.trimmed_ids,
        vec![ids[2].clone()],
        "the unpinned lowest total goes"
    );
    assert_eq!(
        sandbox.ingest_metrics.pinned_trim_alerts(),
        alerts_before + 1,
        "the pinned entry raised an alert"
    );

    let listed = entries(&mut sandbox, &scope).await;
    let remaining: Vec<&str> = listed.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(remaining.len(), 3);
    assert!(
        remaining.contains(&ids[1].as_str()),
        "pinned entry survived"
    );
    assert!(!remaining.contains(&ids[0].as_str()) && !remaining.contains(&ids[2].as_str()));
    // Trimming cached the scores it used.
    let survivor = listed.iter().find(|m| m.id == ids[3]).unwrap();
    let scores = survivor
        .last_scores
        .as_ref()
        .expect("scores cached by the trim");
    assert_eq!(scores.relevance, 0.0);
    assert!((scores.total - (scores.recency + scores.importance)).abs() < 1e-9);

    // Trims are audited; the live count matches the rows.
    let events = audit(&mut sandbox, &scope).await;
    assert_eq!(
        audit_actions(&events)
            .iter()
            .filter(|a| **a == v1::AuditAction::Trim)
            .count(),
        2
    );
    let settings = space_settings(&mut sandbox, &scope).await;
    assert_eq!(settings.memory_count, 3);
    // The trim's rescoring and deletions reached the soft cap's own table.
    crate::helpers::assert_retention_in_step(&sandbox.pool).await;
}

#[tokio::test]
async fn manually_saved_entries_are_never_trimmed() {
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        soft_cap: Some(2),
        ..Default::default()
    })
    .await;
    let scope = new_scope("work");
    let saved = remember_response(
        &mut sandbox,
        v1::RememberRequest {
            manually_saved: true,
            ..remember(&scope, "ok thanks")
        },
    )
    .await
    .memory
    .unwrap();
    sqlx::query("UPDATE memories SET created_at = now() - interval '1 year', importance = 0 WHERE id = $1::uuid")
        .bind(&saved.id)
        .execute(&sandbox.pool)
        .await
        .unwrap();
    sandbox
        .ingest
        .remember(remember(&scope, "the build box is slow"))
        .await
        .unwrap();
    let response = remember_response(
        &mut sandbox,
        remember(&scope, "the office plant needs water"),
    )
    .await;
    assert_eq!(response.trimmed_ids.len(), 1);
    assert_ne!(response.trimmed_ids[0], saved.id);

    // When only protected entries remain, the space stays over its cap rather than lose them.
    update_setting(&mut sandbox, &scope, Setting::SoftCap(1)).await;
    for text in ["pinned one", "pinned two"] {
        sandbox
            .ingest
            .remember(v1::RememberRequest {
                pin: true,
                ..remember(&scope, text)
            })
            .await
            .unwrap();
    }
    let entries = entries(&mut sandbox, &scope).await;
    assert!(
        entries.iter().all(|m| m.pinned || m.manually_saved),
        "only protected entries remain"
    );
    assert_eq!(entries.len(), 3);
}

/// The soft cap is enforced in SQL on the hot path, for all the spaces of a group commit in one
/// statement; the domain policy in `engram-core` is the reference. Both must pick the same victims
/// and raise the same alerts in every space, and no space's entries may affect another's.
#[tokio::test]
async fn the_sql_trim_agrees_with_the_domain_policy() {
    let sandbox = Sandbox::start().await;
    let first =
        engram_core::Scope::parse("scope", &uuid::Uuid::new_v4().to_string(), "work").unwrap();
    let second = engram_core::Scope::parse("scope", &first.user_id.to_string(), "home").unwrap();
    // Ages, importances and score caches chosen to spread totals well apart: fresh caches (used as
    // they are), stale caches and missing ones (recomputed), pinned and saved entries.
    let rows = [
        // (age days, importance, cached total, cache age hours, pinned, saved)
        (1.0, 0.3, None, 0.0, false, false),
        (40.0, 0.1, None, 0.0, false, false),
        (3.0, 0.9, Some(0.05), 2.0, false, false),
        (3.0, 0.9, Some(0.01), 30.0, false, false),
        (90.0, 0.0, None, 0.0, true, false),
        (60.0, 0.05, None, 0.0, false, true),
        (10.0, 0.5, Some(2.5), 1.0, false, false),
        (20.0, 0.2, None, 0.0, false, false),
    ];
    // The second space holds the same shapes with other importances and ages, so that its lowest
    // entries would rank among the first space's if the statement mixed the spaces up.
    for (scope, age_factor, importance_shift) in [(&first, 1.0, 0.0), (&second, 0.5, 0.05)] {
        for (age, importance, cached, cache_age, pinned, saved) in rows {
            sqlx::query(
                "INSERT INTO memories (id, user_id, space, kind, text, category, valid_at, simhash, importance, \
                     pinned, manually_saved, created_at, last_scores) \
                 VALUES (gen_random_uuid(), $1, $2, 'semantic', 'x', 'fact', now(), 1, $3, $4, $5, \
                     now() - make_interval(secs => $6), \
                     CASE WHEN $7::float8 IS NULL THEN NULL ELSE jsonb_build_object('relevance', 0, 'recency', 0, \
                         'importance', $3, 'total', $7::float8, 'computed_at', now() - make_interval(secs => $8)) END)",
            )
            .bind(scope.user_id.as_uuid())
            .bind(scope.space.as_str())
            .bind(f64::min(importance + importance_shift, 1.0))
            .bind(pinned)
            .bind(saved)
            .bind(age * age_factor * 86_400.0)
            .bind(cached)
            .bind(cache_age * 3_600.0)
            .execute(&sandbox.pool)
            .await
            .unwrap();
        }
    }
    // A malformed cache (a total without its time) counts as missing on both sides: recomputed.
    sqlx::query(
        "INSERT INTO memories (id, user_id, space, kind, text, category, valid_at, simhash, importance, \
             created_at, last_scores) \
         VALUES (gen_random_uuid(), $1, $2, 'semantic', 'x', 'fact', now(), 1, 0.0, \
             now() - interval '70 days', '{\"total\": 5.0}')",
    )
    .bind(first.user_id.as_uuid())
    .bind(first.space.as_str())
    .execute(&sandbox.pool)
    .await
    .unwrap();
    let malformed_cached: Option<f64> =
        sqlx::query_scalar("SELECT last_total FROM memory_retention WHERE user_id = $1 AND space = $2 AND importance = 0.0 AND last_scored_at IS NULL AND created_at < now() - interval '69 days'")
            .bind(first.user_id.as_uuid())
            .bind(first.space.as_str())
            .fetch_one(&sandbox.pool)
            .await
            .unwrap();
    assert_eq!(
        malformed_cached, None,
        "a malformed cache is not a cached total"
    );
    let policy = engram_core::RetentionPolicy::default();
    for overage in 1..=4 {
        let mut transaction = engram_store::begin(&sandbox.pool).await.unwrap();
        // The second space one entry further over its cap than the first.
        let spaces = [(&first, overage), (&second, overage + 1)];
        let mut plans = Vec::new();
        for (scope, overage) in spaces {
            let candidates = engram_store::memories::trim_candidates(&mut transaction, scope)
                .await
                .unwrap();
            plans.push(engram_core::capacity::plan_trim(
                &candidates,
                overage,
                chrono::Utc::now(),
                &policy,
            ));
        }
        let targets = spaces.map(
            |(scope, overage)| engram_store::write_path::CapacityTarget {
                scope,
                overage: overage as i64,
            },
        );
        let outcomes =
            engram_store::write_path::enforce_soft_caps(&mut transaction, &targets, &policy)
                .await
                .unwrap();
        assert_eq!(outcomes.len(), 2);
        for ((scope, plan), outcome) in [&first, &second].into_iter().zip(&plans).zip(&outcomes) {
            assert_eq!(
                outcome.trimmed, plan.victims,
                "{} overage {overage}",
                scope.space
            );
            assert_eq!(
                outcome.protected_would_be_victims, plan.protected_would_be_victims,
                "{} overage {overage}",
                scope.space
            );
            // Recomputed scores were cached for the survivors, as the reference recomputes them.
            let survivors = engram_store::memories::trim_candidates(&mut transaction, scope)
                .await
                .unwrap();
            let stored = rows.len() + usize::from(std::ptr::eq(scope, &first));
            assert_eq!(survivors.len(), stored - plan.victims.len());
            for (id, expected) in &plan.rescored {
                if let Some(survivor) = survivors.iter().find(|s| s.id == *id) {
                    let cached = survivor
                        .last_scores
                        .expect("rescored entry has cached scores");
                    assert!(
                        (cached.total - expected.total).abs() < 1e-4,
                        "{id}: {} vs {}",
                        cached.total,
                        expected.total
                    );
                    assert_eq!(cached.relevance, 0.0);
                }
            }
        }
        transaction.rollback().await.unwrap();
    }
}

#[tokio::test]
async fn a_new_entry_the_soft_cap_trims_at_once_is_reported_as_not_kept() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("work");
    update_setting(&mut sandbox, &scope, Setting::SoftCap(1)).await;
    let pinned = remember_response(
        &mut sandbox,
        v1::RememberRequest {
            pin: true,
            ..remember(&scope, "protected fact about the summer house")
        },
    )
    .await;
    assert_eq!(outcome(&pinned), v1::RememberOutcome::Created);

    // The only entry that may be trimmed is the new one.
    let response = remember_response(
        &mut sandbox,
        remember(&scope, "ordinary note about the weather today"),
    )
    .await;
    assert_eq!(outcome(&response), v1::RememberOutcome::TrimmedAtCapacity);
    assert!(response.memory.is_none(), "nothing new is kept");
    assert_eq!(response.trimmed_ids.len(), 1);
    assert!(
        response.message.contains("not kept"),
        "{}",
        response.message
    );
    let left = entries(&mut sandbox, &scope).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, pinned.memory.unwrap().id);
}

/// A space holding an entry older than about 14 years stopped accepting writes once it reached
/// its soft cap: recomputing that entry's recency, exp(−Δt/τ), underflowed in Postgres and every
/// write into the space answered INTERNAL. Importing history is the realistic way in.
#[tokio::test]
async fn a_space_with_decades_old_entries_keeps_accepting_writes_at_its_cap() {
    let mut sandbox = Sandbox::start().await;
    let scope = new_scope("history");
    update_setting(&mut sandbox, &scope, Setting::SoftCap(1)).await;
    // 2011-01-01 and 0001-01-01: both far beyond exp's range at τ = 7 days.
    import(
        &mut sandbox,
        &scope,
        vec![
            imported_fact("old", "I used to live in Leeds", 1_293_840_000),
            imported_fact("ancient", "The first note ever kept", -62_135_596_800),
        ],
    )
    .await;
    let first = remember_response(&mut sandbox, remember(&scope, "My new flat is in Porto")).await;
    assert_eq!(outcome(&first), v1::RememberOutcome::Created);
    assert_eq!(first.trimmed_ids.len(), 2, "both old entries trimmed");
    let second = remember_response(&mut sandbox, remember(&scope, "I cycle to work")).await;
    assert_eq!(outcome(&second), v1::RememberOutcome::Created);
    let kept: Vec<String> = entries(&mut sandbox, &scope)
        .await
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(kept, vec!["I cycle to work"]);
}

/// The soft-cap statement driven with the extremes stored data can hold — entries from year 1
/// to year 9999, cached scores computed in either far past or far future — must answer without
/// an error and agree with the domain policy on every space.
#[test]
fn the_sql_trim_agrees_with_the_domain_policy_at_extreme_timestamps() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let sandbox = runtime.block_on(Sandbox::start());
    // Seconds of 0001-01-01, of 9999-12-31, and a spread between (now included).
    let timestamp = prop_oneof![
        Just(-62_135_596_800i64),
        Just(253_402_300_799i64),
        Just(1_293_840_000i64),
        -62_135_596_800i64..253_402_300_799,
        1_700_000_000i64..1_900_000_000,
    ];
    let entry = (
        timestamp.clone(),
        prop_oneof![Just(0.0f64), Just(1.0), 0.0..=1.0f64],
        proptest::option::of((-10.0..10.0f64, timestamp)),
        any::<bool>(),
        any::<bool>(),
    );
    let space = (proptest::collection::vec(entry, 1..8), 1usize..6);
    let mut runner = TestRunner::new(Config {
        cases: 40,
        failure_persistence: None,
        ..Config::default()
    });
    let policy = engram_core::RetentionPolicy::default();
    let result = runner.run(&space, |(rows, overage)| {
        runtime.block_on(async {
            let scope = engram_core::Scope::parse("scope", &uuid::Uuid::new_v4().to_string(), "edge")
                .unwrap();
            let mut transaction = engram_store::begin(&sandbox.pool).await.unwrap();
            for (created, importance, cached, pinned, saved) in &rows {
                sqlx::query(
                    "INSERT INTO memories (id, user_id, space, kind, text, category, valid_at, simhash, \
                         importance, pinned, manually_saved, created_at, last_scores) \
                     VALUES (gen_random_uuid(), $1, $2, 'semantic', 'x', 'fact', now(), 1, $3, $4, $5, \
                         to_timestamp($6), CASE WHEN $7::float8 IS NULL THEN NULL ELSE \
                         jsonb_build_object('relevance', 0, 'recency', 0, 'importance', $3, \
                             'total', $7::float8, 'computed_at', to_timestamp($8)) END)",
                )
                .bind(scope.user_id.as_uuid())
                .bind(scope.space.as_str())
                .bind(importance)
                .bind(pinned)
                .bind(saved)
                .bind(*created as f64)
                .bind(cached.map(|(total, _)| total))
                .bind(cached.map(|(_, at)| at as f64))
                .execute(&mut *transaction)
                .await
                .unwrap();
            }
            let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
                .fetch_one(&mut *transaction)
                .await
                .unwrap();
            let candidates = engram_store::memories::trim_candidates(&mut transaction, &scope)
                .await
                .unwrap();
            let plan = engram_core::capacity::plan_trim(&candidates, overage, now, &policy);
            let target = engram_store::write_path::CapacityTarget {
                scope: &scope,
                overage: overage as i64,
            };
            let outcome =
                engram_store::write_path::enforce_soft_caps(&mut transaction, &[target], &policy)
                    .await
                    .map_err(|error| TestCaseError::fail(format!("the statement failed: {error}")))?;
            prop_assert_eq!(&outcome[0].trimmed, &plan.victims, "rows {:?}", rows);
            prop_assert_eq!(
                &outcome[0].protected_would_be_victims,
                &plan.protected_would_be_victims
            );
            let cached: Vec<f64> = sqlx::query_scalar(
                "SELECT (last_scores->>'recency')::float8 FROM memories \
                 WHERE user_id = $1 AND space = $2 AND last_scores ? 'recency'",
            )
            .bind(scope.user_id.as_uuid())
            .bind(scope.space.as_str())
            .fetch_all(&mut *transaction)
            .await
            .unwrap();
            prop_assert!(cached.iter().all(|r| (0.0..=1.0).contains(r)), "{cached:?}");
            transaction.rollback().await.unwrap();
            Ok(())
        })
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
}
