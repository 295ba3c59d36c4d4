//! Pieces the benchmark load generators share.

/// User id of benchmark space `n`: deterministic, so the seed step and the load step agree.
pub fn space_user(n: i64) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// The machine a report was produced on, and who shared its cores (`sharing`).
pub fn machine_summary(sharing: &str) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!("{cores} cores ({cpu}); {sharing} share them")
}
