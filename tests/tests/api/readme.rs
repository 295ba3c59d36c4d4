//! The README's grpcurl examples ("Talking to it with grpcurl"), read from README.md at test time
//! and run in order as written, with grpcurl (`make tools`), against the three services configured
//! as `make run` runs them: the local embedding model, the bus, no LLM. Every command must succeed
//! and leave what its comment promises; none may undo what a later one relies on.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use chrono::Utc;
use engram_e2e::{Sandbox, SandboxOptions, TestBus, TestEmbedder};

/// The section of README.md that holds the examples.
const SECTION: &str = "## Talking to it with grpcurl";
/// The addresses the examples use, one per service in the sandbox's order (ingest, retrieval,
/// review).
const README_ADDRESSES: [&str; 3] = ["127.0.0.1:50051", "127.0.0.1:50052", "127.0.0.1:50053"];
/// Printed on stdout before each command, with the command's number.
const MARKER: &str = "@@@readme-example";
/// The examples take a few seconds.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// One command of the examples, with the README line it starts on.
#[derive(Debug)]
struct Example {
    line: usize,
    command: String,
}

/// The shell commands of the section's ```sh blocks, in order: comments and blank lines left
/// out, a line ending in `\` joined with the next.
fn readme_examples(readme: &str) -> Vec<Example> {
    let mut examples = Vec::new();
    let mut in_section = false;
    let mut in_block = false;
    let mut pending: Option<Example> = None;
    for (index, line) in readme.lines().enumerate() {
        if line.starts_with("## ") {
            in_section = line == SECTION;
            continue;
        }
        if !in_section {
            continue;
        }
        if line.starts_with("```") {
            in_block = !in_block && line == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let example = match pending.take() {
            Some(mut started) => {
                started.command.push('\n');
                started.command.push_str(line);
                started
            }
            None if line.trim().is_empty() || line.trim_start().starts_with('#') => continue,
            None => Example {
                line: index + 1,
                command: line.to_owned(),
            },
        };
        if line.ends_with('\\') {
            pending = Some(example);
        } else {
            examples.push(example);
        }
    }
    assert!(pending.is_none(), "the last example ends in a continuation");
    examples
}

/// What each command printed, by command.
struct Outputs<'a> {
    examples: &'a [Example],
    printed: Vec<String>,
}

impl Outputs<'_> {
    /// The output of every command whose text holds `needle`, in order; at least one.
    fn all(&self, needle: &str) -> Vec<&str> {
        let found: Vec<&str> = self
            .examples
            .iter()
            .zip(&self.printed)
            .filter(|(example, _)| example.command.contains(needle))
            .map(|(_, printed)| printed.as_str())
            .collect();
        assert!(!found.is_empty(), "no README example holds {needle:?}");
        found
    }

    /// The output of the one command whose text holds `needle`.
    #[track_caller]
    fn of(&self, needle: &str) -> &str {
        let found = self.all(needle);
        assert_eq!(
            found.len(),
            1,
            "more than one README example holds {needle:?}"
        );
        found[0]
    }
}

/// Where `make tools` installs grpcurl.
fn tools_bin() -> PathBuf {
    let local = std::env::var_os("ENGRAM_LOCAL_DIR")
        .map_or_else(|| PathBuf::from("/var/tmp/engram-local"), PathBuf::from);
    local.join("tools/bin")
}

/// The value of every `"key": value` in an output (grpcurl prints one per line).
fn values<'a>(printed: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("\"{key}\": ");
    printed
        .lines()
        .filter_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .map(|value| value.trim_end_matches(','))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_examples_run_in_order_as_written() {
    let readme_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&readme_path).expect("README.md");
    let examples = readme_examples(&readme);
    assert!(examples.len() >= 40, "{} examples", examples.len());

    let tools = tools_bin();
    let path = match std::env::var_os("PATH") {
        Some(path) => {
            let mut dirs = vec![tools.clone()];
            dirs.extend(std::env::split_paths(&path));
            std::env::join_paths(dirs).expect("a PATH")
        }
        None => tools.clone().into_os_string(),
    };
    let grpcurl = std::process::Command::new("grpcurl")
        .arg("-version")
        .env("PATH", &path)
        .output();
    assert!(
        grpcurl.is_ok_and(|output| output.status.success()),
        "grpcurl not found in {} or on PATH: `make tools` installs it",
        tools.display()
    );

    // As `make run` runs the services: the local model, the bus, no LLM (the local rules).
    let bus = TestBus::local();
    let sandbox = Sandbox::start_with(SandboxOptions {
        embedder: TestEmbedder::Local,
        bus: Some(bus.clone()),
        ..Default::default()
    })
    .await;

    let mut script = String::from("set -euo pipefail\n");
    let mut substituted = BTreeSet::new();
    for (number, example) in examples.iter().enumerate() {
        let mut command = example.command.clone();
        for (readme_address, service) in README_ADDRESSES.iter().zip(&sandbox.services) {
            if command.contains(readme_address) {
                substituted.insert(*readme_address);
                command = command.replace(readme_address, &service.addr.to_string());
            }
        }
        script.push_str(&format!("printf '\\n{MARKER} {number}\\n'\n{command}\n"));
    }
    assert_eq!(
        substituted.len(),
        README_ADDRESSES.len(),
        "the examples reach every service"
    );

    // `timeout` ends a run that hangs; the services answer on this runtime, so the wait blocks
    // another thread.
    let mut bash = std::process::Command::new("timeout");
    bash.arg(RUN_LIMIT.as_secs().to_string())
        .args(["bash", "-c", &script])
        .env("PATH", &path)
        .stdin(Stdio::null());
    let output = tokio::task::spawn_blocking(move || bash.output())
        .await
        .expect("the examples' thread")
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);

    // Split what was printed by command: printed[n] is what command n printed.
    let mut printed = vec![String::new(); examples.len()];
    let mut last_started: Option<usize> = None;
    for line in stdout.lines() {
        if let Some(number) = line.strip_prefix(MARKER) {
            last_started = Some(number.trim().parse().expect("a command number"));
            continue;
        }
        if let Some(number) = last_started {
            printed[number].push_str(line);
            printed[number].push('\n');
        }
    }
    if !output.status.success() {
        let failed = last_started.map(|number| &examples[number]);
        let how = match output.status.code() {
            Some(124) => format!("still running after {RUN_LIMIT:?}"),
            _ => output.status.to_string(),
        };
        panic!(
            "a README example failed ({how}): README.md line {}:\n{}\nstderr:\n{stderr}\nits output:\n{}",
            failed.map_or(0, |example| example.line),
            failed.map_or("(none)", |example| example.command.as_str()),
            last_started.map_or("", |number| printed[number].as_str()),
        );
    }
    assert_eq!(last_started, Some(examples.len() - 1), "every example ran");
    let outputs = Outputs {
        examples: &examples,
        printed,
    };

    // Remember, then a near-duplicate of it.
    let first = outputs.of("I prefer dark mode in every editor");
    assert!(
        first.contains("\"outcome\": \"REMEMBER_OUTCOME_CREATED\""),
        "{first}"
    );
    let merged = outputs.of("i prefer DARK mode in every editor!");
    assert!(
        merged.contains("\"outcome\": \"REMEMBER_OUTCOME_MERGED\""),
        "{merged}"
    );
    assert_eq!(values(merged, "repeatCount"), ["1"], "{merged}");
    // Pin / Unpin / Forget acted on the memory the Remember before them stored, and the same
    // text is then suppressed.
    let pinned = outputs.of("IngestService/Pin");
    assert!(pinned.contains("\"pinned\": true"), "{pinned}");
    let forgotten = outputs.of("IngestService/Forget ");
    assert!(forgotten.contains("tombstoneExpiresAt"), "{forgotten}");
    let spare_key = outputs.all("The spare key is under the blue flowerpot");
    assert_eq!(spare_key.len(), 2);
    assert!(
        spare_key[0].trim().is_empty(),
        "the id was captured: {}",
        spare_key[0]
    );
    assert!(
        spare_key[1].contains("REMEMBER_OUTCOME_SUPPRESSED_BY_TOMBSTONE"),
        "{}",
        spare_key[1]
    );
    // The first retention settings delete nothing of the examples.
    let previews = outputs.all("IngestService/PreviewRetention");
    assert_eq!(previews.len(), 2);
    assert!(
        values(previews[0], "entriesPastMaxAge").is_empty(),
        "{}",
        previews[0]
    );
    // Incognito ends as it started, by RPC and by command.
    let incognito = outputs.of("My bank PIN");
    assert!(
        incognito.contains("REMEMBER_OUTCOME_SKIPPED_INCOGNITO"),
        "{incognito}"
    );
    for command in [
        "Remember that my flight to Lisbon is on Friday",
        "pin this",
        "忘掉这个",
        "start incognito for this chat",
        "stop incognito for this chat",
    ] {
        let answered = outputs.of(command);
        assert_eq!(
            values(answered, "applied"),
            ["true"],
            "{command}: {answered}"
        );
    }
    // The imports are stored, none skipped as incognito.
    for import in outputs.all("IngestService/ImportMemories") {
        assert_eq!(values(import, "created"), ["true", "true", "2"], "{import}");
        assert!(!import.contains("skippedIncognito"), "{import}");
    }
    // The appended turns are stored, not skipped, and the segment closes into an episode whose
    // fact retrieval finds.
    let appended = outputs.of("IngestService/AppendMessages");
    assert_eq!(
        values(appended, "outcome"),
        ["\"TURN_OUTCOME_STORED\"", "\"TURN_OUTCOME_STORED\""],
        "{appended}"
    );
    let closed = outputs.of("IngestService/CloseSegment");
    assert_eq!(values(closed, "requested"), ["true"], "{closed}");
    let conversation = outputs.of("IngestService/GetConversation");
    assert_eq!(values(conversation, "turnCount"), ["2"], "{conversation}");
    assert_eq!(
        values(conversation, "segmentedThrough"),
        ["1"],
        "{conversation}"
    );
    assert!(
        values(conversation, "incognito").is_empty(),
        "{conversation}"
    );
    let manager = outputs.of("\\\"include_history\\\":true");
    assert!(manager.contains("Alice Chen"), "{manager}");
    // Review finds the episode the conversation made (not the imported one).
    let state = outputs.of("ReviewService/GetMemoryState");
    let episode = values(state, "memoryId");
    assert_eq!(episode.len(), 1, "{state}");
    assert!(state.contains("\"fsrs\""), "{state}");
    let imported_ids = outputs
        .all("IngestService/ImportMemories")
        .into_iter()
        .flat_map(|import| values(import, "id"))
        .collect::<Vec<_>>();
    assert!(!imported_ids.contains(&episode[0]), "{state}");
    let graded = outputs.of("ReviewService/GradeMemories");
    assert_eq!(values(graded, "memoryId"), episode, "{graded}");
    // ForgetConversation, near the end, deletes what the examples made of the conversation.
    let receipt = outputs.of("IngestService/ForgetConversation");
    assert_eq!(values(receipt, "turnsDeleted"), ["2"], "{receipt}");
    assert_eq!(values(receipt, "episodesDeleted"), ["2"], "{receipt}");
    // max_age_days, last: the preview counts the imported turns of March 2026 ...
    assert_eq!(
        values(previews[1], "entriesPastMaxAge"),
        ["\"2\""],
        "{}",
        previews[1]
    );
    // ... and since the rule is off again, a retention run now deletes nothing.
    let run = sandbox
        .retention
        .run_once(Utc::now())
        .await
        .expect("a retention run")
        .expect("the run took the lock");
    assert_eq!(
        (run.entries_deleted(), run.turns_deleted()),
        (0, 0),
        "{run:?}"
    );

    // Confidences are exact decimals (never 0.4000000000000001).
    let confidences: Vec<&str> = outputs
        .printed
        .iter()
        .flat_map(|printed| values(printed, "metadataConfidence"))
        .collect();
    assert!(!confidences.is_empty());
    for confidence in confidences {
        let decimals = confidence.split_once('.').map_or(0, |(_, d)| d.len());
        assert!(decimals <= 2, "metadataConfidence {confidence}");
    }

    drop(sandbox);
    crate::helpers::delete_topology(&bus).await;
}
