//! Retrieval quality evaluation of `make eval`.
//!
//! Loads the memory tasks of `tests/eval/tasks.json` into one space per task through ImportMemories
//! (the ingest service's backfill embeds them with the local model), waits until every entry has
//! its embedding, then asks every task's queries through RetrieveMemory under each configuration:
//! both ranking profiles with and without the dense leg, and one-parameter sweeps over α, β, γ, τ,
//! the RRF constant, the candidates per leg and MMR's λ. Writes recall@k, nDCG@k and MRR as
//! Markdown.
//!
//! Every task's space also holds the memories of all the other tasks as distractors (a space of
//! about 300 entries, like a real user's, instead of ten easy ones); only the task's own memories
//! are judged relevant.
//!
//! One ranked list per query: the two sections of a response (facts, episodes) each keep their
//! order (MMR's) and are merged by comparing the scores at their heads.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use engram_bench::eval::{eval_scope, merge_by_heads, ndcg_at, wait_for_embeddings, write_report};
use engram_proto::v1;
use engram_proto::v1::ingest_service_client::IngestServiceClient;
use engram_proto::v1::retrieval_service_client::RetrievalServiceClient;
use engram_server::time::to_proto;
use serde::Deserialize;
use tonic::transport::Channel;

/// Namespace of the evaluation's conversation ids (UUIDv5 of task and memory key).
const CONVERSATION_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x0e5a_1e00_c0de_4000_8000_0000_0000_0002);
/// Results asked for per section; k goes up to this.
const RESULTS_PER_SECTION: u32 = 10;

#[derive(Parser)]
#[command(about = "Engram retrieval quality evaluation")]
struct Cli {
    #[arg(long, default_value = "tests/eval/tasks.json")]
    tasks: PathBuf,
    #[arg(long, default_value = "http://127.0.0.1:50071")]
    ingest: String,
    #[arg(long, default_value = "http://127.0.0.1:50072")]
    retrieval: String,
    #[arg(long)]
    report: PathBuf,
    /// The command line to record in the report.
    #[arg(long, default_value = "make eval")]
    command_line: String,
    /// Longest wait for the backfill to embed every imported entry.
    #[arg(long, default_value_t = 600)]
    embed_timeout_secs: u64,
}

#[derive(Deserialize)]
struct TaskFile {
    tasks: Vec<Task>,
}

#[derive(Deserialize)]
struct Task {
    id: String,
    theme: String,
    language: String,
    memories: Vec<TaskMemory>,
    queries: Vec<TaskQuery>,
}

#[derive(Deserialize)]
struct TaskMemory {
    key: String,
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    summary: Option<String>,
    #[serde(default)]
    messages: Vec<TaskMessage>,
    #[serde(default)]
    category: Option<String>,
    days_ago: f64,
    #[serde(default)]
    importance: Option<f64>,
    #[serde(default)]
    pinned: bool,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    surprise: Option<f64>,
}

#[derive(Deserialize)]
struct TaskMessage {
    role: String,
    content: String,
}

#[derive(Deserialize)]
struct TaskQuery {
    query: String,
    /// Memory key → graded relevance (2 = the answer, 1 = useful context).
    relevant: BTreeMap<String, u32>,
}

/// A task as loaded: its memories' Engram ids mapped back to their keys.
struct LoadedTask<'a> {
    task: &'a Task,
    key_of: HashMap<String, String>,
}

/// One retrieval configuration under evaluation.
#[derive(Clone)]
struct Config {
    group: &'static str,
    label: String,
    ranking: v1::RankingOptions,
}

#[derive(Default, Clone, Copy)]
struct Scores {
    recall_5: f64,
    recall_10: f64,
    ndcg_5: f64,
    ndcg_10: f64,
    mrr: f64,
    queries: u32,
}

impl Scores {
    fn add(&mut self, other: &Scores) {
        self.recall_5 += other.recall_5;
        self.recall_10 += other.recall_10;
        self.ndcg_5 += other.ndcg_5;
        self.ndcg_10 += other.ndcg_10;
        self.mrr += other.mrr;
        self.queries += other.queries;
    }

    fn row(&self) -> String {
        let n = f64::from(self.queries.max(1));
        format!(
            "{:.3} | {:.3} | {:.3} | {:.3} | {:.3}",
            self.recall_5 / n,
            self.recall_10 / n,
            self.ndcg_5 / n,
            self.ndcg_10 / n,
            self.mrr / n
        )
    }

    fn ndcg_10_mean(&self) -> f64 {
        self.ndcg_10 / f64::from(self.queries.max(1))
    }
}

/// Metrics of one ranked list against graded judgements.
fn score_ranking(ranked: &[String], relevant: &BTreeMap<String, u32>) -> Scores {
    let recall = |k: usize| {
        let found = ranked
            .iter()
            .take(k)
            .filter(|key| relevant.contains_key(*key))
            .count();
        found as f64 / relevant.len().max(1) as f64
    };
    let mrr = ranked
        .iter()
        .position(|key| relevant.contains_key(key))
        .map_or(0.0, |position| 1.0 / (position + 1) as f64);
    Scores {
        recall_5: recall(5),
        recall_10: recall(10),
        ndcg_5: ndcg_at(ranked, relevant, 5),
        ndcg_10: ndcg_at(ranked, relevant, 10),
        mrr,
        queries: 1,
    }
}

fn category(name: Option<&str>) -> anyhow::Result<v1::Category> {
    Ok(match name {
        None => v1::Category::Unspecified,
        Some("fact") => v1::Category::Fact,
        Some("preference") => v1::Category::Preference,
        Some("experience") => v1::Category::Experience,
        Some("guideline") => v1::Category::Guideline,
        Some("decision") => v1::Category::Decision,
        Some("todo") => v1::Category::Todo,
        Some("goal") => v1::Category::Goal,
        Some(other) => bail!("unknown category {other:?}"),
    })
}

fn scope(task: &Task) -> v1::Scope {
    eval_scope(format!("eval/{}", task.id))
}

fn import_entry(
    task: &Task,
    memory: &TaskMemory,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<v1::ImportedMemory> {
    let created = now - chrono::Duration::seconds((memory.days_ago * 86_400.0) as i64);
    let mut entry = v1::ImportedMemory {
        client_id: memory.key.clone(),
        text: memory.text.clone().unwrap_or_default(),
        tags: memory.tags.clone(),
        importance: memory.importance,
        pinned: memory.pinned,
        created_at: Some(to_proto(created)),
        ..Default::default()
    };
    match memory.kind.as_str() {
        "semantic" => {
            entry.kind = v1::MemoryKind::Semantic.into();
            entry.category = category(memory.category.as_deref())?.into();
        }
        "episodic" => {
            entry.kind = v1::MemoryKind::Episodic.into();
            entry.title = memory.title.clone().context("an episode needs a title")?;
            entry.text = memory
                .summary
                .clone()
                .context("an episode needs a summary")?;
            entry.surprise = memory.surprise;
            entry.conversation_id = uuid::Uuid::new_v5(
                &CONVERSATION_NAMESPACE,
                format!("{}/{}", task.id, memory.key).as_bytes(),
            )
            .to_string();
            entry.messages = memory
                .messages
                .iter()
                .map(|message| v1::Message {
                    role: match message.role.as_str() {
                        "assistant" => v1::SpeakerRole::Assistant,
                        "system" => v1::SpeakerRole::System,
                        _ => v1::SpeakerRole::User,
                    }
                    .into(),
                    content: message.content.clone(),
                })
                .collect();
            // The excerpt took about a minute per turn, ending when the episode was made.
            let turns = memory.messages.len().max(1) as i64;
            entry.start_at = Some(to_proto(created - chrono::Duration::minutes(turns)));
            entry.end_at = Some(to_proto(created));
        }
        other => bail!("unknown memory kind {other:?}"),
    }
    Ok(entry)
}

async fn load_tasks<'a>(
    ingest: &mut IngestServiceClient<Channel>,
    tasks: &'a [Task],
) -> anyhow::Result<Vec<LoadedTask<'a>>> {
    let now = chrono::Utc::now();
    let mut loaded = Vec::new();
    for task in tasks {
        let mut memories = Vec::new();
        for source in tasks {
            for memory in &source.memories {
                let mut entry = import_entry(source, memory, now)
                    .with_context(|| format!("task {}", source.id))?;
                if source.id != task.id {
                    // A distractor: its own client id, never judged relevant.
                    entry.client_id = format!("{}/{}", source.id, memory.key);
                }
                memories.push(entry);
            }
        }
        let mut key_of = HashMap::new();
        for batch in memories.chunks(500) {
            let response = ingest
                .import_memories(v1::ImportMemoriesRequest {
                    scope: Some(scope(task)),
                    memories: batch.to_vec(),
                    context_turns: None,
                })
                .await
                .with_context(|| format!("importing task {}", task.id))?
                .into_inner();
            key_of.extend(
                response
                    .entries
                    .into_iter()
                    .map(|entry| (entry.id, entry.client_id)),
            );
        }
        loaded.push(LoadedTask { task, key_of });
    }
    Ok(loaded)
}

/// The ranked memory keys RetrieveMemory answers for a query under a configuration.
async fn ranked_keys(
    retrieval: &mut RetrievalServiceClient<Channel>,
    loaded: &LoadedTask<'_>,
    query: &str,
    config: &Config,
) -> anyhow::Result<(Vec<String>, String)> {
    let response = retrieval
        .retrieve_memory(v1::RetrieveMemoryRequest {
            scope: Some(scope(loaded.task)),
            query: query.into(),
            episodic_limit: Some(RESULTS_PER_SECTION),
            semantic_limit: Some(RESULTS_PER_SECTION),
            detail: v1::DetailLevel::None.into(),
            token_budget: Some(32_000),
            ranking: Some(config.ranking),
            ..Default::default()
        })
        .await
        .with_context(|| format!("{} / {query:?}", config.label))?
        .into_inner();
    let section = |results: &[v1::RetrievedMemory]| -> Vec<(f64, String)> {
        results
            .iter()
            .map(|result| {
                let id = result.memory.as_ref().map_or("", |m| m.id.as_str());
                let total = result.score.as_ref().map_or(0.0, |score| score.total);
                let key = loaded.key_of.get(id).cloned().unwrap_or_default();
                (total, key)
            })
            .collect()
    };
    let merged = merge_by_heads(section(&response.semantic), section(&response.episodic));
    let path = response.served_by.map(|s| s.path).unwrap_or_default();
    Ok((merged, path))
}

fn ranking(profile: v1::RankingProfile) -> v1::RankingOptions {
    v1::RankingOptions {
        profile: profile.into(),
        ..Default::default()
    }
}

/// `options` as given, then with the vector leg skipped.
fn with_and_without_dense(
    group: &'static str,
    name: &str,
    options: v1::RankingOptions,
) -> [Config; 2] {
    [(false, "BM25 + vector"), (true, "BM25 only")].map(|(sparse_only, legs)| Config {
        group,
        label: format!("{name}, {legs}"),
        ranking: v1::RankingOptions {
            sparse_only,
            ..options
        },
    })
}

/// The configurations: the four baselines, then one parameter at a time around the defaults.
fn configurations() -> Vec<Config> {
    let mut configs = Vec::new();
    for (profile, name) in [
        (v1::RankingProfile::Fsrs, "fsrs"),
        (v1::RankingProfile::Triscore, "triscore"),
    ] {
        // The starting parameters, whatever the service's defaults are now.
        let starting = v1::RankingOptions {
            alpha: Some(1.0),
            beta: Some(1.0),
            gamma: Some(1.0),
            recency_tau_days: Some(7.0),
            rrf_k: Some(60.0),
            candidates_per_leg: Some(100),
            mmr_lambda: Some(0.7),
            ..ranking(profile)
        };
        configs.extend(with_and_without_dense("baseline", name, starting));
    }
    let triscore = ranking(v1::RankingProfile::Triscore);
    let fsrs = ranking(v1::RankingProfile::Fsrs);
    // The best of each profile's grids below, with and without the dense leg, for the by-theme
    // table.
    let tuned_triscore = v1::RankingOptions {
        alpha: Some(4.0),
        beta: Some(0.5),
        gamma: Some(0.5),
        recency_tau_days: Some(30.0),
        candidates_per_leg: Some(20),
        ..triscore
    };
    let tuned_fsrs = v1::RankingOptions {
        rrf_k: Some(5.0),
        candidates_per_leg: Some(20),
        ..fsrs
    };
    for (name, options) in [
        ("tuned fsrs (k = 5, N = 20)", tuned_fsrs),
        (
            "tuned triscore (α = 4, β = γ = 0.5, τ = 30 d, N = 20)",
            tuned_triscore,
        ),
    ] {
        configs.extend(with_and_without_dense("tuned", name, options));
    }
    for value in [0.0, 0.5, 1.0, 2.0, 4.0, 8.0] {
        configs.push(Config {
            group: "alpha",
            label: format!("triscore α = {value}"),
            ranking: v1::RankingOptions {
                alpha: Some(value),
                ..triscore
            },
        });
    }
    for value in [0.0, 0.25, 0.5, 1.0, 2.0] {
        configs.push(Config {
            group: "beta",
            label: format!("triscore β = {value}"),
            ranking: v1::RankingOptions {
                beta: Some(value),
                ..triscore
            },
        });
    }
    for value in [0.0, 0.25, 0.5, 1.0, 2.0] {
        configs.push(Config {
            group: "gamma",
            label: format!("triscore γ = {value}"),
            ranking: v1::RankingOptions {
                gamma: Some(value),
                ..triscore
            },
        });
    }
    for value in [1.0, 3.0, 7.0, 30.0, 90.0, 365.0] {
        configs.push(Config {
            group: "tau",
            label: format!("triscore τ = {value} days"),
            ranking: v1::RankingOptions {
                recency_tau_days: Some(value),
                ..triscore
            },
        });
    }
    for value in [5.0, 20.0, 60.0, 120.0] {
        configs.push(Config {
            group: "rrf_k",
            label: format!("fsrs RRF k = {value}"),
            ranking: v1::RankingOptions {
                rrf_k: Some(value),
                ..fsrs
            },
        });
    }
    for value in [5, 20, 50, 100, 200] {
        for (base, name) in [(fsrs, "fsrs"), (triscore, "triscore")] {
            configs.push(Config {
                group: "candidates",
                label: format!("{name} N = {value}"),
                ranking: v1::RankingOptions {
                    candidates_per_leg: Some(value),
                    ..base
                },
            });
        }
    }
    // Joint grids around the best single-parameter values (one-at-a-time sweeps miss interactions).
    for alpha in [4.0, 8.0, 16.0] {
        for beta in [0.25, 0.5, 1.0] {
            for gamma in [0.25, 0.5] {
                for tau in [7.0, 30.0] {
                    configs.push(Config {
                        group: "triscore-grid",
                        label: format!(
                            "triscore α = {alpha}, β = {beta}, γ = {gamma}, τ = {tau} d"
                        ),
                        ranking: v1::RankingOptions {
                            alpha: Some(alpha),
                            beta: Some(beta),
                            gamma: Some(gamma),
                            recency_tau_days: Some(tau),
                            ..triscore
                        },
                    });
                }
            }
        }
    }
    for rrf_k in [1.0, 2.0, 5.0, 10.0, 20.0] {
        for candidates in [10, 20, 50, 100] {
            configs.push(Config {
                group: "fsrs-grid",
                label: format!("fsrs RRF k = {rrf_k}, N = {candidates}"),
                ranking: v1::RankingOptions {
                    rrf_k: Some(rrf_k),
                    candidates_per_leg: Some(candidates),
                    ..fsrs
                },
            });
        }
    }
    for value in [0.5, 0.7, 0.85, 1.0] {
        configs.push(Config {
            group: "mmr",
            label: format!("fsrs MMR λ = {value}"),
            ranking: v1::RankingOptions {
                mmr_lambda: Some(value),
                ..fsrs
            },
        });
    }
    configs
}

struct ConfigResult {
    config: Config,
    overall: Scores,
    by_theme: BTreeMap<String, Scores>,
    paths: BTreeMap<String, u32>,
}

async fn evaluate(
    retrieval: &mut RetrievalServiceClient<Channel>,
    tasks: &[LoadedTask<'_>],
    config: Config,
) -> anyhow::Result<ConfigResult> {
    let mut overall = Scores::default();
    let mut by_theme: BTreeMap<String, Scores> = BTreeMap::new();
    let mut paths: BTreeMap<String, u32> = BTreeMap::new();
    for loaded in tasks {
        for query in &loaded.task.queries {
            let (ranked, path) = ranked_keys(retrieval, loaded, &query.query, &config).await?;
            let scores = score_ranking(&ranked, &query.relevant);
            overall.add(&scores);
            by_theme
                .entry(loaded.task.theme.clone())
                .or_default()
                .add(&scores);
            if loaded.task.language != "en" {
                by_theme
                    .entry(format!("language: {}", loaded.task.language))
                    .or_default()
                    .add(&scores);
            }
            *paths.entry(path).or_default() += 1;
        }
    }
    Ok(ConfigResult {
        config,
        overall,
        by_theme,
        paths,
    })
}

const HEADER: &str =
    "| configuration | recall@5 | recall@10 | nDCG@5 | nDCG@10 | MRR |\n|---|---|---|---|---|---|";

fn report(
    results: &[ConfigResult],
    tasks: &[Task],
    command_line: &str,
    elapsed: Duration,
) -> String {
    let memories: usize = tasks.iter().map(|t| t.memories.len()).sum();
    let queries: usize = tasks.iter().map(|t| t.queries.len()).sum();
    let mut themes: BTreeMap<&str, usize> = BTreeMap::new();
    for task in tasks {
        *themes.entry(task.theme.as_str()).or_default() += 1;
    }
    let theme_list = themes
        .iter()
        .map(|(theme, n)| format!("{theme} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut out = format!(
        "# Retrieval quality evaluation\n\n\
         Produced by `{command_line}` on {date} in {secs:.0} s.\n\n\
         {tasks} tasks of our own (`tests/eval/tasks.json`; {theme_list}), {memories} memories, {queries} \
         queries with graded judgements (2 = the answer, 1 = useful context). Each task is its own space, \
         loaded through ImportMemories with creation dates spread over the past months and embedded by the \
         ingest service's backfill (all-MiniLM-L6-v2); each space also holds every other task's memories as \
         distractors ({memories} entries per space), judged irrelevant. Every query goes through \
         RetrieveMemory over gRPC asking for 10 facts and 10 episodes; the two sections keep their order \
         (MMR's) and are merged into one ranked list by comparing the scores at their heads. nDCG uses \
         gain 2^grade − 1. Parameters not named in a row are the service defaults.\n",
        date = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        secs = elapsed.as_secs_f64(),
        tasks = tasks.len(),
    );
    let groups: [(&str, &str); 9] = [
        (
            "baseline",
            "Ranking profiles at the issue's starting parameters (α = β = γ = 1, τ = 7 d, k = 60, N = 100), with and without the dense leg",
        ),
        (
            "tuned",
            "Ranking profiles at the parameters chosen from the sweeps below",
        ),
        (
            "alpha",
            "triscore: relevance weight α (the other parameters at the service defaults)",
        ),
        ("beta", "triscore: recency weight β"),
        ("gamma", "triscore: importance weight γ"),
        ("tau", "triscore: recency time constant τ"),
        ("rrf_k", "fsrs: RRF constant k"),
        ("candidates", "Candidates per leg N"),
        ("mmr", "fsrs: MMR λ (1 = no diversity)"),
    ];
    for (group, title) in groups {
        out.push_str(&format!("\n## {title}\n\n{HEADER}\n"));
        for result in results.iter().filter(|r| r.config.group == group) {
            out.push_str(&format!(
                "| {} | {} |\n",
                result.config.label,
                result.overall.row()
            ));
        }
    }
    for (group, title) in [
        (
            "triscore-grid",
            "triscore: joint grid over α, β, γ, τ (best 8 of 36 by nDCG@10)",
        ),
        (
            "fsrs-grid",
            "fsrs: joint grid over RRF k and N (best 8 of 20 by nDCG@10)",
        ),
    ] {
        out.push_str(&format!("\n## {title}\n\n{HEADER}\n"));
        let mut grid: Vec<&ConfigResult> =
            results.iter().filter(|r| r.config.group == group).collect();
        grid.sort_by(|a, b| {
            b.overall
                .ndcg_10_mean()
                .total_cmp(&a.overall.ndcg_10_mean())
        });
        for result in grid.into_iter().take(8) {
            out.push_str(&format!(
                "| {} | {} |\n",
                result.config.label,
                result.overall.row()
            ));
        }
    }
    out.push_str("\n## By theme (nDCG@10)\n\n");
    let baselines: Vec<&ConfigResult> = results
        .iter()
        .filter(|r| r.config.group == "baseline" || r.config.group == "tuned")
        .collect();
    out.push_str(&format!(
        "| theme | {} |\n|---|{}\n",
        baselines
            .iter()
            .map(|r| r.config.label.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(baselines.len())
    ));
    let theme_names: Vec<String> = baselines
        .first()
        .map(|r| r.by_theme.keys().cloned().collect())
        .unwrap_or_default();
    for theme in theme_names {
        let cells: Vec<String> = baselines
            .iter()
            .map(|r| format!("{:.3}", r.by_theme[&theme].ndcg_10_mean()))
            .collect();
        out.push_str(&format!(
            "| {theme} ({} queries) | {} |\n",
            baselines[0].by_theme[&theme].queries,
            cells.join(" | ")
        ));
    }
    out.push_str("\n## Which path served each query\n\n| configuration | paths |\n|---|---|\n");
    for result in &baselines {
        let paths = result
            .paths
            .iter()
            .map(|(path, n)| format!("{path}: {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        out.push_str(&format!("| {} | {paths} |\n", result.config.label));
    }
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let started = Instant::now();
    let file: TaskFile = serde_json::from_str(
        &std::fs::read_to_string(&cli.tasks)
            .with_context(|| format!("reading {}", cli.tasks.display()))?,
    )
    .with_context(|| format!("parsing {}", cli.tasks.display()))?;
    let mut ingest = IngestServiceClient::connect(cli.ingest.clone()).await?;
    let mut retrieval = RetrievalServiceClient::connect(cli.retrieval.clone()).await?;

    eprintln!("importing {} tasks", file.tasks.len());
    let loaded = load_tasks(&mut ingest, &file.tasks).await?;
    eprintln!("waiting for the backfill to embed every entry");
    let spaces: Vec<(v1::Scope, Option<usize>)> = loaded
        .iter()
        .map(|task| (scope(task.task), Some(task.key_of.len())))
        .collect();
    wait_for_embeddings(
        &mut retrieval,
        &spaces,
        Duration::from_secs(cli.embed_timeout_secs),
    )
    .await?;

    let mut results = Vec::new();
    for config in configurations() {
        let result = evaluate(&mut retrieval, &loaded, config).await?;
        eprintln!("{:<32} {}", result.config.label, result.overall.row());
        results.push(result);
    }
    let text = report(&results, &file.tasks, &cli.command_line, started.elapsed());
    write_report(&cli.report, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfect_and_missing_rankings_score_one_and_zero() {
        let relevant = BTreeMap::from([("a".to_owned(), 2), ("b".to_owned(), 1)]);
        let perfect = score_ranking(&["a".into(), "b".into(), "c".into()], &relevant);
        assert!((perfect.ndcg_10 - 1.0).abs() < 1e-9);
        assert!((perfect.recall_5 - 1.0).abs() < 1e-9);
        assert!((perfect.mrr - 1.0).abs() < 1e-9);
        let missing = score_ranking(&["c".into(), "d".into()], &relevant);
        assert_eq!(missing.ndcg_10, 0.0);
        assert_eq!(missing.recall_10, 0.0);
        assert_eq!(missing.mrr, 0.0);
    }

    #[test]
    fn swapping_grades_lowers_ndcg_but_not_recall() {
        let relevant = BTreeMap::from([("a".to_owned(), 2), ("b".to_owned(), 1)]);
        let swapped = score_ranking(&["b".into(), "a".into()], &relevant);
        assert!(swapped.ndcg_5 < 1.0 && swapped.ndcg_5 > 0.5);
        assert!((swapped.recall_5 - 1.0).abs() < 1e-9);
    }
}
