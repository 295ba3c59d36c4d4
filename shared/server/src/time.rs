//! Conversions between chrono timestamps and protobuf `Timestamp`s.

use chrono::{DateTime, Utc};

pub fn to_proto(timestamp: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: timestamp.timestamp(),
        nanos: timestamp.timestamp_subsec_nanos() as i32,
    }
}

pub fn to_proto_opt(timestamp: Option<DateTime<Utc>>) -> Option<prost_types::Timestamp> {
    timestamp.map(to_proto)
}
