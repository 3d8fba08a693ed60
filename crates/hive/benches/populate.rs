//! Populate + start + stop of synthetic hives, against the same objects wired
//! by hand.
//!
//! `cargo bench -p cellium-hive --bench populate`
//!
//! Cell `N` provides `Arc<Node<N>>` from up to three lower-numbered nodes
//! (picked pseudo-randomly), appends a start and a stop hook, and has an invoke
//! that needs its node, so every node is built. The hand-wired baseline builds
//! the same nodes from the same edges in a `Vec` and runs the same hooks in
//! order and in reverse, without validation, timeouts, spans or health. Both
//! sides run one monomorphized copy of code per node type, as real cells do.

use std::any::Any;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellium_hive::{BoxError, Cell, Hive, Hook, Lifecycle, Module};
use futures::future::BoxFuture;
use seq_macro::seq;

/// A synthetic object; `N` makes each node a distinct type.
struct Node<const N: usize> {
    deps: Vec<Arc<dyn Any + Send + Sync>>,
}

/// The `k`th dependency of node `n`: a lower-numbered node (n >= 1).
const fn pick(n: usize, k: usize) -> usize {
    let mut x = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (k as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    (x % n as u64) as usize
}

/// The hooks every node appends: cheap, but real futures.
fn hooks(lc: &Lifecycle) {
    lc.append(
        Hook::new("start")
            .on_start(|_| async { Ok(()) })
            .on_stop(|_| async { Ok(()) }),
    );
}

fn root(lc: Lifecycle) -> Arc<Node<0>> {
    hooks(&lc);
    Arc::new(Node { deps: Vec::new() })
}

fn make<const N: usize, const A: usize, const B: usize, const C: usize>(
    lc: Lifecycle,
    a: Arc<Node<A>>,
    b: Arc<Node<B>>,
    c: Arc<Node<C>>,
) -> Arc<Node<N>> {
    hooks(&lc);
    Arc::new(Node {
        deps: vec![a, b, c],
    })
}

fn touch<const N: usize>(node: Arc<Node<N>>) {
    black_box(node.deps.len());
}

fn cell<const N: usize, const A: usize, const B: usize, const C: usize>(id: &'static str) -> Cell {
    Module::new(id, "a synthetic node")
        .provide(make::<N, A, B, C>)
        .invoke(touch::<N>)
        .into()
}

fn cells(count: usize) -> Vec<Cell> {
    let mut cells = Vec::with_capacity(count);
    cells.push(
        Module::new("node-0", "the root")
            .provide(root)
            .invoke(touch::<0>)
            .into(),
    );
    seq!(N in 1..1000 {
        if N < count {
            cells.push(cell::<N, { pick(N, 1) }, { pick(N, 2) }, { pick(N, 3) }>(concat!("node-", N)));
        }
    });
    cells
}

type HookFn = Box<dyn FnOnce() -> BoxFuture<'static, Result<(), BoxError>>>;

/// Builds node `N` by hand and queues its hooks. Generic over `N`, as the
/// hive's constructors are, so both sides run one copy of code per node type.
fn by_hand<const N: usize>(
    deps: Vec<Arc<dyn Any + Send + Sync>>,
    starts: &mut Vec<HookFn>,
    stops: &mut Vec<HookFn>,
) -> Arc<dyn Any + Send + Sync> {
    starts.push(Box::new(|| Box::pin(async { Ok(()) })));
    stops.push(Box::new(|| Box::pin(async { Ok(()) })));
    let node = Arc::new(Node::<N> { deps });
    touch::<N>(node.clone());
    node
}

/// The same objects and hooks, wired by hand.
async fn hand_wired(count: usize) -> usize {
    let mut nodes: Vec<Arc<dyn Any + Send + Sync>> = Vec::with_capacity(count);
    let mut starts: Vec<HookFn> = Vec::with_capacity(count);
    let mut stops: Vec<HookFn> = Vec::with_capacity(count);
    nodes.push(by_hand::<0>(Vec::new(), &mut starts, &mut stops));
    seq!(N in 1..1000 {
        if N < count {
            let deps = (1..=3).map(|k| nodes[pick(N, k)].clone()).collect();
            let node = by_hand::<N>(deps, &mut starts, &mut stops);
            nodes.push(node);
        }
    });
    for s in starts {
        s().await.ok();
    }
    for s in stops.into_iter().rev() {
        s().await.ok();
    }
    nodes.len()
}

/// Times of one run: (total, populate, start, stop).
async fn with_hive(cells: Vec<Cell>) -> [Duration; 4] {
    let t0 = Instant::now();
    let mut hive = Hive::new(cells);
    hive.populate().expect("the synthetic hive is valid");
    let t1 = Instant::now();
    hive.start().await.expect("start");
    let t2 = Instant::now();
    hive.stop().await.expect("stop");
    let t3 = Instant::now();
    [t3 - t0, t1 - t0, t2 - t1, t3 - t2]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut last = (0.0, 0.0);
    for (count, runs) in [(100, 400), (1000, 100)] {
        // Warm up allocator and caches.
        for _ in 0..3 {
            rt.block_on(with_hive(cells(count)));
            rt.block_on(hand_wired(count));
        }
        let mut hive_times = Vec::with_capacity(runs);
        let mut phases: [Vec<Duration>; 3] = Default::default();
        let mut hand_times = Vec::with_capacity(runs);
        let mut declare_times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let c = cells(count);
            declare_times.push(t.elapsed());
            let [total, populate, start, stop] = rt.block_on(with_hive(c));
            hive_times.push(total);
            for (p, t) in phases.iter_mut().zip([populate, start, stop]) {
                p.push(t);
            }
            let t = Instant::now();
            black_box(rt.block_on(hand_wired(count)));
            hand_times.push(t.elapsed());
        }
        let (h, w, d) = (
            median(hive_times),
            median(hand_times),
            median(declare_times),
        );
        let ratio = h.as_secs_f64() / w.as_secs_f64();
        println!(
            "{count:>5} cells: hive populate+start+stop {:.3} ms (declaring the cells {:.3} ms more), hand-wired {:.3} ms, ratio {ratio:.1}x (median of {runs})",
            ms(h),
            ms(d),
            ms(w)
        );
        let [p, s, t] = phases.map(median);
        println!(
            "{count:>5} cells: phases (medians): new+populate {:.3} ms, start {:.3} ms, stop {:.3} ms",
            ms(p),
            ms(s),
            ms(t)
        );
        last = (ms(h), ratio);
    }
    println!(
        "RESULT hive populate_start_stop_1000_ms={:.3} ratio_vs_handwired={:.1}",
        last.0, last.1
    );
}
