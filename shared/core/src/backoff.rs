//! Retry delays that grow exponentially, are spread by jitter, and never exceed their maximum.
//!
//! backon's jitter adds a random part of up to one whole delay on top of it, so a maximum of
//! 10 s let a reconnect wait almost 20 s (15.5 s was seen). Here the exponential runs between
//! half the bounds, and every jittered delay lands in [min/2, max).

use std::time::Duration;

use backon::ExponentialBuilder;

/// Delays from about `min` up to `max` (each jittered within the lower half below its step),
/// without a limit on attempts; add one with `with_max_times`.
pub fn jittered_backoff(min: Duration, max: Duration) -> ExponentialBuilder {
    let max = max.max(min);
    ExponentialBuilder::default()
        .with_min_delay(min / 2)
        .with_max_delay(max / 2)
        .without_max_times()
        .with_jitter()
}

#[cfg(test)]
mod tests {
    use backon::BackoffBuilder as _;

    use super::*;

    #[test]
    fn no_delay_exceeds_the_maximum_and_they_still_grow() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(10);
        for _ in 0..200 {
            let delays: Vec<Duration> = jittered_backoff(min, max).build().take(30).collect();
            assert!(
                delays.iter().all(|d| *d <= max && *d >= min / 2),
                "{delays:?}"
            );
            assert!(delays[0] <= min);
            assert!(delays[29] >= max / 2, "reaches the top of the range");
        }
        // A maximum below the minimum is read as the minimum.
        let flat: Vec<Duration> = jittered_backoff(min, Duration::ZERO)
            .build()
            .take(5)
            .collect();
        assert!(flat.iter().all(|d| *d <= min), "{flat:?}");
    }
}
