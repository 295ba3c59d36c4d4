//! What Engram's benchmarks and evaluations share: the load generators' seeding and host
//! measurements (`bench`), CPU profiles for their reports (`profile`), and the evaluations'
//! scoring and reports (`eval`). The programs are in `src/bin`, run by `make bench-*` and
//! `make eval*`; each writes its report under docs/.

#![forbid(unsafe_code)]

pub mod bench;
pub mod eval;
pub mod profile;
