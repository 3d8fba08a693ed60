//! The traffic that runs across the restarts, between pods of the cluster:
//!
//! - **a live TCP stream**: the sender writes a 64-byte record (sequence number, time sent)
//!   every millisecond with `TCP_NODELAY`, so each record is a segment of its own; the
//!   receiver checks the sequence and notes when each record arrived. A record that is late
//!   shows as its delay; a gap in the sequence would be a record lost for good (TCP does not
//!   let that happen on a connection that stays up, so it is checked, not assumed);
//! - **new connections to a named port**: a third pod connects to a fourth pod's port `stream`
//!   every 10 ms (100 ms timeout), as a client opening connections through the restart would,
//!   and each attempt's outcome is noted. Pods of their own, so that the kernel's TCP counters
//!   of the stream's two pods count the stream alone.
//!
//! Both reach their destination only through an egress rule that names the port (`stream`),
//! which resolves against the destinations' named ports in the ipcache, so what the restore
//! does with named ports shows in the refusals.

use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cellium_integration::NetNs;
use cellium_integration::bench::Shape;

/// The receiver's port and its name.
pub const PORT: u16 = 7000;
const PORT_NAME: &str = "stream";
/// Bytes of a record.
const RECORD: usize = 64;
/// Time between records.
const INTERVAL: Duration = Duration::from_millis(1);
/// Time between new connections of the prober, and how long each may take.
const PROBE_INTERVAL: Duration = Duration::from_millis(10);
const PROBE_TIMEOUT: Duration = Duration::from_millis(100);

/// Which pods of the cluster the traffic runs between (indexes of the shape's pods).
///
/// The destinations' ingress is enforced (a NetworkPolicy of their namespace selects them and
/// admits every pod of `ns-0`); the sender and the prober, pods of `ns-0`, may send only to
/// ports named `stream`. Their records come before the destinations' in the order the restore
/// reads them, so that they are restored first.
#[derive(Debug, Clone, Copy)]
pub struct Roles {
    /// The stream's sender.
    pub sender: usize,
    /// The stream's receiver, serving `stream` (7000/TCP).
    pub receiver: usize,
    /// The pod opening new connections.
    pub prober: usize,
    /// The pod it opens them to, serving `stream` (7000/TCP).
    pub target: usize,
    /// A pod whose connections the receiver's policy refuses (checked after each restart).
    pub denied: usize,
}

impl Roles {
    /// The roles in a cluster of `shape` whose pod `i` has its record restored as the
    /// `order(i)`-th: the sender and the prober are the two pods of `ns-0` restored first, the
    /// receiver and the target the two restored last of those a policy admitting `ns-0`
    /// selects; pod 1, of `ns-1`, is one the receiver's policy refuses.
    pub fn choose(shape: Shape, order: impl Fn(usize) -> usize) -> Result<Roles> {
        let n = shape.namespaces;
        if n < 10 || shape.pods < 2 * n || shape.policies < n.min(100) {
            bail!(
                "the traffic needs at least 10 namespaces, 2 pods per namespace and a policy per namespace"
            );
        }
        let mut sources: Vec<usize> = (0..shape.pods).filter(|i| i % n == 0).collect();
        sources.sort_by_key(|&i| order(i));
        // Pod i is in ns-(i % n), group g-(i / n % 10); policy j < 100 of ns-j selects group
        // g-(j % 10) and admits ns-0 and ns-j: pod i is selected by policy i % n when
        // (i / n) % 10 == (i % n) % 10.
        let mut destinations: Vec<usize> = (0..shape.pods)
            .filter(|i| i % n > 1 && i % n < 100 && (i / n) % 10 == (i % n) % 10)
            .collect();
        destinations.sort_by_key(|&i| std::cmp::Reverse(order(i)));
        let (Some(&sender), Some(&prober), Some(&receiver), Some(&target)) = (
            sources.first(),
            sources.get(1),
            destinations.first(),
            destinations.get(1),
        ) else {
            bail!("the cluster has too few pods of ns-0 or selected by a policy admitting it");
        };
        if order(prober) > order(target) {
            bail!("no two pods a policy admitting ns-0 selects are restored after two of ns-0");
        }
        Ok(Roles {
            sender,
            receiver,
            prober,
            target,
            denied: 1,
        })
    }

    /// The objects the traffic needs on top of the cluster: the destinations' pods again,
    /// with their container port named `stream`, and the egress policy of the sources.
    pub fn yaml(&self, shape: Shape) -> String {
        let mut out = String::new();
        for i in [self.receiver, self.target] {
            let labels: Vec<String> = shape
                .pod_labels(i)
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let key = shape.pod_key(i);
            let (ns, name) = key.split_once('/').unwrap_or_default();
            out.push_str(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {name}, namespace: {ns}, labels: {{ {} }} }}\nspec: {{ containers: [ {{ name: c, ports: [ {{ name: {PORT_NAME}, containerPort: {PORT} }} ] }} ] }}\n---\n",
                labels.join(", ")
            ));
        }
        out.push_str(&format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{ name: stream-out, namespace: ns-0 }}\nspec:\n  podSelector: {{ matchExpressions: [ {{ key: app, operator: In, values: [ app-{}, app-{} ] }} ] }}\n  policyTypes: [ Egress ]\n  egress:\n  - ports: [ {{ port: {PORT_NAME} }} ]\n",
            self.sender, self.prober
        ));
        out
    }
}

/// One record as the receiver saw it (times since the stream's epoch).
#[derive(Debug, Clone, Copy)]
struct Arrival {
    seq: u64,
    sent: Duration,
    arrived: Duration,
}

#[derive(Debug)]
struct Shared {
    epoch: Instant,
    stop: AtomicBool,
    sent: AtomicU64,
    arrivals: Mutex<Vec<Arrival>>,
    /// New connections: when each was started and whether it connected.
    attempts: Mutex<Vec<(Duration, bool)>>,
}

/// The traffic, running until [`Traffic::finish`].
#[derive(Debug)]
pub struct Traffic {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<Result<()>>>,
}

/// What the traffic did in a window of time.
#[derive(Debug, Default, Clone, Copy)]
pub struct Window {
    /// Records sent in the window.
    pub sent: u64,
    /// The longest a record sent in the window took to arrive.
    pub max_delay: Duration,
    /// The longest time between two arrivals in the window.
    pub max_gap: Duration,
    /// New connections started in the window, and how many of them failed.
    pub connects: usize,
    /// Of which failed (refused, dropped or timed out).
    pub refused: usize,
}

impl Traffic {
    /// Listens in the receiver's and the target's namespaces, connects the stream from the
    /// sender's and starts the records and the prober.
    pub fn start(
        (sender, receiver): (&NetNs, SocketAddrV4),
        (prober, target): (&NetNs, SocketAddrV4),
        (receiver_ns, target_ns): (&NetNs, &NetNs),
    ) -> Result<Traffic> {
        let listener = receiver_ns
            .run(move || TcpListener::bind(receiver))?
            .with_context(|| format!("listening on {receiver}"))?;
        let stream = sender
            .run(move || {
                TcpStream::connect_timeout(&SocketAddr::V4(receiver), Duration::from_secs(2))
            })?
            .with_context(|| format!("connecting the stream to {receiver}"))?;
        stream.set_nodelay(true)?;
        let (inbound, _) = listener.accept().context("accepting the stream")?;
        let probed = target_ns
            .run(move || TcpListener::bind(target))?
            .with_context(|| format!("listening on {target}"))?;
        probed.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            epoch: Instant::now(),
            stop: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            arrivals: Mutex::new(Vec::with_capacity(1 << 16)),
            attempts: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let send = std::thread::spawn(move || send(stream, &s));
        let s = shared.clone();
        let receive = std::thread::spawn(move || receive(inbound, &s));
        let s = shared.clone();
        let accept = std::thread::spawn(move || accept(probed, &s));
        let s = shared.clone();
        let probe = prober.run(move || std::thread::spawn(move || probe(target, &s)))?;
        Ok(Traffic {
            shared,
            threads: vec![send, receive, accept, probe],
        })
    }

    /// The time since the stream's epoch: what windows are given in.
    pub fn now(&self) -> Duration {
        self.shared.epoch.elapsed()
    }

    /// What happened to records sent, and connections started, in `[from, to)`.
    pub fn window(&self, from: Duration, to: Duration) -> Window {
        let arrivals = lock(&self.shared.arrivals);
        let mut w = Window::default();
        let mut last: Option<Duration> = None;
        for a in arrivals.iter() {
            if a.sent >= from && a.sent < to {
                w.sent += 1;
                w.max_delay = w.max_delay.max(a.arrived - a.sent);
            }
            if a.arrived >= from && a.arrived < to {
                if let Some(prev) = last {
                    w.max_gap = w.max_gap.max(a.arrived - prev);
                }
                last = Some(a.arrived);
            }
        }
        for (at, ok) in lock(&self.shared.attempts).iter() {
            if *at >= from && *at < to {
                w.connects += 1;
                w.refused += usize::from(!ok);
            }
        }
        w
    }

    /// Stops the traffic, waits for every record sent to arrive, and checks the sequence.
    /// Returns how many records were sent.
    pub fn finish(self) -> Result<u64> {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join()
                .map_err(|_| anyhow::anyhow!("a traffic thread panicked"))??;
        }
        let sent = self.shared.sent.load(Ordering::Relaxed);
        let arrivals = lock(&self.shared.arrivals);
        if arrivals.len() as u64 != sent {
            bail!(
                "{sent} records sent, {} arrived: the stream lost records",
                arrivals.len()
            );
        }
        if let Some((i, a)) = arrivals
            .iter()
            .enumerate()
            .find(|(i, a)| a.seq != *i as u64)
        {
            bail!("record {} arrived where record {i} was due", a.seq);
        }
        Ok(sent)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes a record every [`INTERVAL`] on a fixed schedule (a record that could not go out on
/// time goes as soon as it can, and the delay shows at the receiver); at the stop, closes
/// the stream.
fn send(mut stream: TcpStream, s: &Shared) -> Result<()> {
    let mut next = Instant::now();
    let mut record = [0u8; RECORD];
    let mut seq = 0u64;
    while !s.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += INTERVAL;
        let sent = s.epoch.elapsed().as_nanos() as u64;
        record[..8].copy_from_slice(&seq.to_le_bytes());
        record[8..16].copy_from_slice(&sent.to_le_bytes());
        stream
            .write_all(&record)
            .with_context(|| format!("sending record {seq}"))?;
        seq += 1;
        s.sent.store(seq, Ordering::Relaxed);
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    Ok(())
}

/// Reads records until the sender closes the stream.
fn receive(mut stream: TcpStream, s: &Shared) -> Result<()> {
    let mut record = [0u8; RECORD];
    loop {
        match stream.read_exact(&mut record) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e).context("receiving the stream"),
        }
        let arrived = s.epoch.elapsed();
        let field = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&record[r]);
            u64::from_le_bytes(b)
        };
        lock(&s.arrivals).push(Arrival {
            seq: field(0..8),
            sent: Duration::from_nanos(field(8..16)),
            arrived,
        });
    }
}

/// Accepts the prober's connections (at the target) and closes them.
fn accept(listener: TcpListener, s: &Shared) -> Result<()> {
    while !s.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => drop(conn),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e).context("accepting a new connection"),
        }
    }
    Ok(())
}

/// Opens a connection every [`PROBE_INTERVAL`] and notes whether it connected within
/// [`PROBE_TIMEOUT`] (runs on a thread of the prober's namespace).
fn probe(to: SocketAddrV4, s: &Shared) -> Result<()> {
    let mut next = Instant::now();
    while !s.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next = Instant::now() + PROBE_INTERVAL;
        let at = s.epoch.elapsed();
        let ok = TcpStream::connect_timeout(&SocketAddr::V4(to), PROBE_TIMEOUT).is_ok();
        lock(&s.attempts).push((at, ok));
    }
    Ok(())
}
