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

/// A request's timestamp; out-of-range values are an InvalidArgument naming the field.
pub fn from_proto(
    field: &str,
    timestamp: &prost_types::Timestamp,
) -> Result<DateTime<Utc>, engram_core::ValidationError> {
    u32::try_from(timestamp.nanos)
        .ok()
        .and_then(|nanos| DateTime::from_timestamp(timestamp.seconds, nanos))
        .ok_or_else(|| engram_core::ValidationError::new(field, "is not a valid timestamp"))
}

pub fn from_proto_opt(
    field: &str,
    timestamp: Option<&prost_types::Timestamp>,
) -> Result<Option<DateTime<Utc>>, engram_core::ValidationError> {
    timestamp.map(|t| from_proto(field, t)).transpose()
}
