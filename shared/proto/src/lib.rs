//! Engram's gRPC and event contracts (`proto/engram/v1`), generated at build time by
//! `tonic-prost-build`. Build-time generation keeps the `.proto` files the one source of truth;
//! protoc comes vendored, so no install step is needed.
//!
//! Proto types stop at the gRPC edge: services convert them into domain types on the way in.

#![allow(clippy::all, reason = "generated code is not ours to lint")]

mod codec;

pub mod engram {
    pub mod v1 {
        tonic::include_proto!("engram.v1");
    }
}

pub use engram::v1;

/// The encoded `FileDescriptorSet` of every Engram proto, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("engram_descriptor");
