//! A TCP ping-pong for latency benchmarks: a client sends a message, the server echoes it,
//! lock-step, and the client records every round trip. `sockperf` does this for IPv4 in the
//! benchmarks; this one speaks both families (the `sockperf` of Debian 12 has no IPv6).
//!
//! ```no_run
//! use std::time::Duration;
//! use cellium_integration::pingpong;
//!
//! let addr = "[fd00:10:244::12]:11112".parse().unwrap();
//! std::thread::spawn(move || pingpong::serve(addr));
//! let p50 = pingpong::run(addr, 64, Duration::from_secs(4)).unwrap().p50();
//! println!("{:.3}", p50.as_secs_f64() * 1e6);
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Round trips of one run.
#[derive(Debug, Clone, Default)]
pub struct RoundTrips(Vec<Duration>);

impl RoundTrips {
    /// How many there were.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there were none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The median round trip (zero when there was none).
    pub fn p50(&self) -> Duration {
        let mut sorted = self.0.clone();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied().unwrap_or_default()
    }
}

/// Echoes every connection to `addr` (one at a time, as the client runs) until the process
/// ends; returns only if the listener fails.
pub fn serve(addr: SocketAddr) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    for conn in listener.incoming() {
        let mut conn = conn?;
        conn.set_nodelay(true)?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if conn.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Connects to a [`serve`]r at `addr` and makes round trips of `size`-byte messages for
/// `duration`.
pub fn run(addr: SocketAddr, size: usize, duration: Duration) -> std::io::Result<RoundTrips> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    conn.set_nodelay(true)?;
    let message = vec![0x5a_u8; size];
    let mut echo = vec![0u8; size];
    let mut out = Vec::new();
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let sent = Instant::now();
        conn.write_all(&message)?;
        conn.read_exact(&mut echo)?;
        out.push(sent.elapsed());
    }
    Ok(RoundTrips(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_round_trip() {
        let r = RoundTrips([5, 1, 3].into_iter().map(Duration::from_micros).collect());
        assert_eq!(r.p50(), Duration::from_micros(3));
        assert_eq!(RoundTrips::default().p50(), Duration::ZERO);
    }
}
