//! The gRPC API of all three services against a real Postgres (one database per test).

mod access;
mod bus;
mod capacity;
mod commands;
mod concurrency;
mod controls;
mod embeddings;
mod helpers;
mod read_services;
mod validation;
mod write_path;
