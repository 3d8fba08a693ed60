//! The clock of `bpf_ktime_get_ns()`: CLOCK_MONOTONIC in nanoseconds.

use nix::time::{ClockId, clock_gettime};

use crate::error::{Error, Result};

/// Nanoseconds on the datapath's clock, comparable with conntrack deadlines.
pub fn ktime_now_ns() -> Result<u64> {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).map_err(Error::Clock)?;
    // The monotonic clock counts from boot: both parts are non-negative.
    let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
    Ok(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward() {
        let a = ktime_now_ns().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = ktime_now_ns().unwrap();
        assert!(b >= a + 1_000_000, "{a} -> {b}");
    }
}
