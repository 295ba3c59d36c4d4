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

/// Seconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: the range protobuf's Timestamp
/// defines (and one Postgres stores without surprises).
const MIN_SECONDS: i64 = -62_135_596_800;
const MAX_SECONDS: i64 = 253_402_300_799;

/// The earliest time requests and stored data hold (year 1): a lower bound Postgres accepts,
/// where chrono's `MIN_UTC` is out of its range.
pub fn earliest_supported() -> DateTime<Utc> {
    DateTime::from_timestamp(MIN_SECONDS, 0).expect("year 1 is a valid time")
}

/// Whether a time lies within the years 1 to 9999, the range requests and stored data hold.
pub fn is_supported(timestamp: DateTime<Utc>) -> bool {
    (MIN_SECONDS..=MAX_SECONDS).contains(&timestamp.timestamp())
}

/// A request's timestamp; out-of-range values are an InvalidArgument naming the field.
pub fn from_proto(
    field: &str,
    timestamp: &prost_types::Timestamp,
) -> Result<DateTime<Utc>, engram_core::ValidationError> {
    if !(MIN_SECONDS..=MAX_SECONDS).contains(&timestamp.seconds) {
        return Err(engram_core::ValidationError::new(
            field,
            "must lie between the years 1 and 9999",
        ));
    }
    u32::try_from(timestamp.nanos)
        .ok()
        .filter(|nanos| *nanos < 1_000_000_000)
        .and_then(|nanos| DateTime::from_timestamp(timestamp.seconds, nanos))
        .ok_or_else(|| engram_core::ValidationError::new(field, "is not a valid timestamp"))
}

pub fn from_proto_opt(
    field: &str,
    timestamp: Option<&prost_types::Timestamp>,
) -> Result<Option<DateTime<Utc>>, engram_core::ValidationError> {
    timestamp.map(|t| from_proto(field, t)).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_outside_years_1_to_9999_are_refused() {
        let at = |seconds| prost_types::Timestamp { seconds, nanos: 0 };
        assert!(from_proto("t", &at(MAX_SECONDS)).is_ok());
        assert!(from_proto("t", &at(MIN_SECONDS)).is_ok());
        assert!(from_proto("t", &at(MAX_SECONDS + 1)).is_err());
        assert!(from_proto("t", &at(MIN_SECONDS - 1)).is_err());
        let bad_nanos = prost_types::Timestamp {
            seconds: 0,
            nanos: 1_000_000_000,
        };
        assert!(from_proto("t", &bad_nanos).is_err());
        assert!(is_supported(earliest_supported()));
        assert_eq!(earliest_supported().format("%Y").to_string(), "0001");
    }
}
