//! Pieces the benchmark load generators share.

pub use engram_testkit::drop_topology;

/// User id of benchmark space `n`: deterministic, so the seed step and the load step agree.
pub fn space_user(n: i64) -> String {
    format!("00000000-0000-4000-8000-{n:012}")
}

/// Vacuums and analyzes every table of the benchmark database once its seed is in, the rows that
/// triggers wrote (`memory_retention`, `spaces`) included: left to autovacuum, a seed's millions of
/// new rows are vacuumed while the load runs, on one of the two cores it is measured on. A
/// deployment's bulk load is long settled by the time it serves traffic.
pub async fn settle_seed(connection: &mut sqlx::PgConnection) -> sqlx::Result<()> {
    sqlx::query("VACUUM ANALYZE").execute(connection).await?;
    Ok(())
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

/// How fast this host is right now, in two numbers that do not depend on Engram: the time of one
/// dependent load from memory (a random walk over 256 MB, far beyond the caches: what index
/// lookups wait on) and of a fixed integer loop (pure CPU). The development machines are shared
/// hosts whose speed drifted by a third within an hour; printed in each report, these tell a
/// slower build from a slower host when two reports are compared.
#[derive(Debug, Clone, Copy)]
pub struct HostSpeed {
    pub memory_load_ns: f64,
    pub integer_loop_ms: f64,
}

impl HostSpeed {
    pub fn measure() -> Self {
        Self {
            memory_load_ns: memory_load_ns(),
            integer_loop_ms: integer_loop_ms(),
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "random memory load {:.0} ns, integer loop {:.0} ms",
            self.memory_load_ns, self.integer_loop_ms
        )
    }
}

/// Mean time of one load in a random cycle through 256 MB (each load's address comes from the
/// previous one, so they cannot overlap).
fn memory_load_ns() -> f64 {
    const SLOTS: usize = 32 << 20; // 32 Mi slots of 8 bytes
    const LOADS: usize = 4_000_000;
    // Sattolo's shuffle: one cycle through every slot, so the walk never settles in a short loop.
    let mut next: Vec<u64> = (0..SLOTS as u64).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    for i in (1..SLOTS).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = (state % i as u64) as usize;
        next.swap(i, j);
    }
    let mut at = 0_usize;
    let started = std::time::Instant::now();
    for _ in 0..LOADS {
        at = next[at] as usize;
    }
    let elapsed = started.elapsed();
    std::hint::black_box(at);
    elapsed.as_nanos() as f64 / LOADS as f64
}

/// Time of a fixed chain of dependent integer operations.
fn integer_loop_ms() -> f64 {
    let started = std::time::Instant::now();
    let mut value = 1_u64;
    for i in 0..200_000_000_u64 {
        value = std::hint::black_box(
            value
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(i),
        );
    }
    std::hint::black_box(value);
    started.elapsed().as_secs_f64() * 1000.0
}
