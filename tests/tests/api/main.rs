//! The gRPC API of all three services against a real Postgres (one database per test).

mod access;
mod bus;
mod capacity;
mod commands;
mod concurrency;
mod controls;
mod conversations;
mod deadlines;
mod dense;
mod embeddings;
mod extremes;
mod group_commit;
mod helpers;
mod isolation;
mod metrics;
mod privacy;
mod read_services;
mod readiness;
mod response_size;
mod retention;
mod retrieval;
mod review;
mod traces;
mod transfer;
mod validation;
mod write_path;
