//! The scale-out guard (docs/architecture.md, "Scale-out"): on a distributed Postgres (Citus),
//! every tenant table (one with a `user_id` column) is distributed by `user_id`, and Postgres
//! can only enforce a primary key or unique index there if it includes `user_id`. This test
//! reads the catalog of a migrated database and fails when a tenant table has a key without
//! `user_id` (migration 19 gave the last seven such keys their `user_id`).

use engram_e2e::Sandbox;

/// Tables that are not per user: on Citus they stay local to the coordinator (or are reference
/// tables).
const GLOBAL_TABLES: &[&str] = &["_sqlx_migrations", "outbox_events"];

#[tokio::test]
async fn every_key_of_a_tenant_table_includes_the_user() {
    let sandbox = Sandbox::start().await;
    let keys: Vec<(String, String, Vec<String>)> = sqlx::query_as(
        "SELECT c.relname::text, i.relname::text, \
                ARRAY(SELECT a.attname::text FROM unnest(ix.indkey) AS k(attnum) \
                      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum) \
         FROM pg_index ix \
         JOIN pg_class c ON c.oid = ix.indrelid \
         JOIN pg_class i ON i.oid = ix.indexrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'public' AND ix.indisunique \
           AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'user_id') \
         ORDER BY 1, 2",
    )
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    assert!(!keys.is_empty(), "the catalog lists no tenant table");
    let without: Vec<String> = keys
        .iter()
        .filter(|(_, _, columns)| !columns.iter().any(|column| column == "user_id"))
        .map(|(table, index, columns)| format!("{table}.{index} ({})", columns.join(", ")))
        .collect();
    assert!(
        without.is_empty(),
        "keys without user_id, which a distributed Postgres cannot enforce (include user_id, see \
         docs/architecture.md, \"Scale-out\"): {without:?}"
    );
    // The keys that point at memories follow its key, user first.
    let references: Vec<String> = sqlx::query_scalar(
        "SELECT conrelid::regclass::text || ': ' || pg_get_constraintdef(oid) FROM pg_constraint \
         WHERE contype = 'f' AND connamespace = 'public'::regnamespace ORDER BY 1",
    )
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    for reference in &references {
        assert!(
            reference.contains("FOREIGN KEY (user_id"),
            "a foreign key that does not start with user_id cannot stay on one shard: {reference}"
        );
    }

    let untenanted: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'public' AND c.relkind = 'r' \
           AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'user_id') \
         ORDER BY 1",
    )
    .fetch_all(&sandbox.pool)
    .await
    .unwrap();
    for table in &untenanted {
        assert!(
            GLOBAL_TABLES.contains(&table.as_str()),
            "{table} has no user_id: every table is per user unless it is listed as global"
        );
    }
}
