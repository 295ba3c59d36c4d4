//! Where the machine's CPU went during a measurement: `perf record` over the whole system while
//! it runs, then the share of each process (Postgres, the service, the load generator) and the
//! hottest functions of the service and of Postgres. Benchmarks put it in their reports beside
//! pg_stat_statements, which says which statements took Postgres' share. Without `perf` (or the
//! right to use it) the report says so and the measurement is unchanged.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// Samples per second and CPU: enough for shares to the per cent over ten seconds, little enough
/// that the profile costs the measurement almost nothing.
const FREQUENCY: &str = "499";
/// Functions listed, of the service and of Postgres each.
const TOP_FUNCTIONS: usize = 15;

/// A `perf record` running for a measurement.
pub struct Profiler {
    recording: Child,
    data: PathBuf,
    service_pid: u32,
}

/// What a profile found.
#[derive(Debug, Clone, Default)]
pub struct CpuProfile {
    /// Each process's share of the samples, largest first.
    pub by_process: Vec<(String, f64)>,
    /// The service's functions by their share of the service's own samples, largest first.
    pub service_functions: Vec<(String, f64)>,
    /// Postgres' functions by their share of Postgres' own samples, largest first.
    pub postgres_functions: Vec<(String, f64)>,
}

impl Profiler {
    /// Starts recording the whole system for `seconds` at most (see [`Profiler::finish`]); `None`
    /// (with the reason on stderr) when perf cannot run here.
    pub fn start(seconds: u64, service_pid: u32) -> Option<Self> {
        let data = std::env::temp_dir().join(format!("engram-bench-{}.perf", std::process::id()));
        let recording = Command::new("perf")
            .args([
                "record",
                "--all-cpus",
                "--freq",
                FREQUENCY,
                "--quiet",
                "--output",
            ])
            .arg(&data)
            .args(["--", "sleep", &seconds.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match recording {
            Ok(recording) => Some(Self {
                recording,
                data,
                service_pid,
            }),
            Err(error) => {
                eprintln!("no CPU profile in the report: perf did not start ({error})");
                None
            }
        }
    }

    /// Ends the recording (now, if the measurement ended before its time was up) and reads it.
    pub fn finish(mut self) -> Option<CpuProfile> {
        // A measurement that ended before the recording's time stops it (perf then writes what it
        // has and ends its workload, `sleep`, with SIGTERM: its exit status is not success).
        let stopped_early = matches!(self.recording.try_wait(), Ok(None))
            && Command::new("kill")
                .args(["-INT", &self.recording.id().to_string()])
                .status()
                .is_ok_and(|status| status.success());
        let recorded = self
            .recording
            .wait()
            .map(|status| status.success() || (stopped_early && self.data.exists()));
        if !matches!(recorded, Ok(true)) {
            eprintln!("no CPU profile in the report: perf record failed ({recorded:?})");
            return None;
        }
        let threads = self.report(&["--sort", "pid"])?;
        let functions = self.report(&[
            "--sort",
            "sym",
            "--pid",
            &self.service_pid.to_string(),
            "--percentage",
            "relative",
        ])?;
        let postgres_functions = self
            .report(&[
                "--sort",
                "sym",
                "--comm",
                "postgres",
                "--percentage",
                "relative",
            ])
            .unwrap_or_default();
        let _ = std::fs::remove_file(&self.data);
        Some(CpuProfile {
            by_process: by_process(&threads, self.service_pid),
            service_functions: top_functions(functions),
            postgres_functions: top_functions(postgres_functions),
        })
    }

    /// `perf report` sorted by `keys`: each line's share and what it names.
    fn report(&self, keys: &[&str]) -> Option<Vec<(String, f64)>> {
        let output = Command::new("perf")
            .args(["report", "--stdio", "--no-children", "--input"])
            .arg(&self.data)
            .args(keys)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&output.stdout);
        Some(
            text.lines()
                .filter(|line| !line.starts_with('#'))
                .filter_map(|line| {
                    let (share, named) = line.trim().split_once('%')?;
                    Some((named.trim().to_owned(), share.trim().parse().ok()?))
                })
                .collect(),
        )
    }
}

/// The [`TOP_FUNCTIONS`] largest of a `perf report --sort sym`, without its `[.]` marks.
fn top_functions(functions: Vec<(String, f64)>) -> Vec<(String, f64)> {
    functions
        .into_iter()
        .take(TOP_FUNCTIONS)
        .map(|(symbol, share)| (symbol.trim_start_matches("[.] ").to_owned(), share))
        .collect()
}

/// Threads (`tid:comm`) summed into their processes, named for the report.
fn by_process(threads: &[(String, f64)], service_pid: u32) -> Vec<(String, f64)> {
    let own_pid = std::process::id();
    let mut shares: HashMap<String, f64> = HashMap::new();
    for (thread, share) in threads {
        let (tid, comm) = thread.split_once(':').unwrap_or(("", thread));
        let process = tid.trim().parse::<u32>().ok().and_then(process_of);
        let name = match process {
            Some(pid) if pid == service_pid => "the service".to_owned(),
            Some(pid) if pid == own_pid => "the load generator (this benchmark)".to_owned(),
            _ if comm.starts_with("postgres") => "Postgres".to_owned(),
            _ if comm.starts_with("swapper") => "idle".to_owned(),
            _ => "other".to_owned(),
        };
        *shares.entry(name).or_default() += share;
    }
    let mut shares: Vec<(String, f64)> = shares.into_iter().collect();
    shares.sort_by(|a, b| b.1.total_cmp(&a.1));
    shares
}

/// The process a thread belongs to, while it still runs.
fn process_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

impl CpuProfile {
    /// The profile as a report section: `what` names the measurement.
    pub fn markdown(&self, what: &str) -> String {
        let processes: Vec<String> = self
            .by_process
            .iter()
            .map(|(name, share)| format!("| {name} | {share:.1} % |"))
            .collect();
        let rows = |functions: &[(String, f64)]| -> String {
            functions
                .iter()
                .map(|(symbol, share)| {
                    let symbol: String = symbol.chars().take(100).collect();
                    format!("| {share:.1} % | `{symbol}` |")
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        format!(
            "Where the machine's CPU went during {what} (`perf record --all-cpus` at \
             {FREQUENCY} Hz over the measurement; shares of all samples, idle included):\n\n\
             | process | share |\n|---|---|\n{}\n\n\
             The service's hottest functions (shares of the service's own samples):\n\n\
             | share | function |\n|---|---|\n{}\n\n\
             Postgres' hottest functions (shares of Postgres' own samples, every backend's and \
             background process's):\n\n\
             | share | function |\n|---|---|\n{}\n\n",
            processes.join("\n"),
            rows(&self.service_functions),
            rows(&self.postgres_functions)
        )
    }
}
