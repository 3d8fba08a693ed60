//! Maglev lookup tables (Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load
//! Balancer", NSDI 2016, section 3.4), as Cilium's `pkg/maglev` builds them.
//!
//! Every backend, named by a stable string (`address:port`), gets a permutation of the M
//! table positions from two hashes of its name: `offset = h1 % M`, `skip = h2 % (M - 1) + 1`,
//! position `j` = `(offset + j * skip) % M`; M prime makes every permutation visit every
//! position. The backends then take turns, each taking its next preferred position still
//! free, until the table is full. Each backend ends with M/N entries (within one), and
//! removing a backend frees its entries while the others' mostly stay where they were: new
//! connections of the removed backend move, few others do.
//!
//! The table depends only on the names and M (not on their order, nor on the node), so every
//! node computes the same one.

use std::net::{IpAddr, SocketAddr};

/// The table sizes `bpf-lb-maglev-table-size` accepts (Cilium's list): primes, each a bit
/// under a power of two. A table should be well over 100 times the backends of a frontend
/// for the entries to spread evenly.
pub const TABLE_SIZES: [u32; 10] = [
    251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071,
];

/// The default table size (Cilium's).
pub const DEFAULT_TABLE_SIZE: u32 = 16381;

/// Seeds of the two name hashes: any two distinct values, the same on every node.
const SEED_OFFSET: u64 = 0x6d61_676c_6576_0001;
const SEED_SKIP: u64 = 0x6d61_676c_6576_0002;

/// The table of `m` positions for the backends named `names`: each position holds the index
/// (into `names`) of its backend. Empty when there are no backends. Duplicate names are one
/// backend, the first.
pub fn table(names: &[String], m: u32) -> Vec<usize> {
    if names.is_empty() || m == 0 {
        return Vec::new();
    }
    let m = u64::from(m);
    // Turns go by name, so that the input's order changes nothing.
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|a, b| names[*a].cmp(&names[*b]).then(a.cmp(b)));
    order.dedup_by(|a, b| names[*a] == names[*b]);
    let perms: Vec<(u64, u64)> = order
        .iter()
        .map(|i| {
            let name = names[*i].as_bytes();
            let offset = hash(SEED_OFFSET, name) % m;
            let skip = if m > 1 {
                hash(SEED_SKIP, name) % (m - 1) + 1
            } else {
                1
            };
            (offset, skip)
        })
        .collect();
    let mut next = vec![0u64; order.len()];
    let mut entry: Vec<Option<usize>> = vec![None; m as usize];
    let mut filled = 0u64;
    loop {
        for (turn, &(offset, skip)) in perms.iter().enumerate() {
            // Every permutation visits every position: a free one is always found.
            let mut pos = (offset + next[turn] * skip) % m;
            while entry[pos as usize].is_some() {
                next[turn] += 1;
                pos = (offset + next[turn] * skip) % m;
            }
            entry[pos as usize] = Some(order[turn]);
            next[turn] += 1;
            filled += 1;
            if filled == m {
                return entry.into_iter().flatten().collect();
            }
        }
    }
}

/// The seed of the datapath's connection hash (`CEL_LB_MAGLEV_SEED`).
const FLOW_SEED: u32 = 0x4d61_676c;

/// The hash the datapath indexes a frontend's table with (`lb4_hash` / `lb6_hash` in
/// `bpf/lib/lb.h`) for a connection from `client` to `frontend`: a new connection takes the
/// entry `flow_hash(..) % M`. Both addresses are of one family. Mirrors the datapath word for
/// word (addresses and ports as the packet carries them, read as native-endian words), so
/// tools and tests can tell which entry, and so which backend, a flow gets.
pub fn flow_hash(client: SocketAddr, frontend: SocketAddr, protocol: u8) -> u32 {
    let mut h = FLOW_SEED;
    for ip in [client.ip(), frontend.ip()] {
        let octets = match ip {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        for word in octets.chunks_exact(4) {
            h = mix(h, u32::from_ne_bytes([word[0], word[1], word[2], word[3]]));
        }
    }
    let port = |p: u16| u32::from(u16::from_ne_bytes(p.to_be_bytes()));
    h = mix(h, (port(client.port()) << 16) | port(frontend.port()));
    finish(mix(h, u32::from(protocol)))
}

fn mix(h: u32, w: u32) -> u32 {
    let w = w
        .wrapping_mul(0xcc9e_2d51)
        .rotate_left(15)
        .wrapping_mul(0x1b87_3593);
    (h ^ w)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

fn finish(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// FNV-1a over `bytes` from `seed`, then the splitmix64 finaliser (FNV alone spreads short,
/// similar names poorly). Fixed here, not the standard library's hasher, whose output may
/// change between Rust releases: tables must be the same from every agent version.
fn hash(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("10.244.{}.{}:8080", i / 200, i % 200 + 1))
            .collect()
    }

    fn counts(t: &[usize], n: usize) -> Vec<usize> {
        let mut c = vec![0; n];
        for i in t {
            c[*i] += 1;
        }
        c
    }

    #[test]
    fn every_size_is_prime() {
        for m in TABLE_SIZES {
            assert!((2..m).take_while(|d| d * d <= m).all(|d| m % d != 0), "{m}");
        }
        assert!(TABLE_SIZES.contains(&DEFAULT_TABLE_SIZE));
    }

    #[test]
    fn the_table_is_full_and_even() {
        for n in [1, 2, 3, 7, 100] {
            let t = table(&names(n), 16381);
            assert_eq!(t.len(), 16381);
            let c = counts(&t, n);
            let (min, max) = (*c.iter().min().unwrap(), *c.iter().max().unwrap());
            // Turns give every backend M/N entries, within one.
            assert!(max - min <= 1, "n={n}: {min}..{max}");
        }
        assert!(table(&[], 251).is_empty());
    }

    #[test]
    fn identical_input_gives_an_identical_table_whatever_the_order() {
        let a = names(10);
        let mut b = a.clone();
        b.reverse();
        let ta: Vec<&String> = table(&a, 4093).iter().map(|i| &a[*i]).collect();
        let tb: Vec<&String> = table(&b, 4093).iter().map(|i| &b[*i]).collect();
        assert_eq!(ta, tb);
        assert_eq!(table(&a, 4093), table(&a, 4093));
        // A fixed point, so that a change of the hash (which would move every connection of
        // every node on upgrade) cannot go unnoticed.
        let t = table(&names(3), 251);
        assert_eq!(&t[..12], &FIRST_ENTRIES);
    }

    const FIRST_ENTRIES: [usize; 12] = [1, 1, 2, 0, 0, 0, 0, 0, 1, 0, 0, 1];

    /// Removing one of N backends frees its M/N entries for the others, and moves few of the
    /// others' entries (the paper's bound: the disruption stays close to the minimum).
    #[test]
    fn removing_a_backend_moves_mostly_its_own_entries() {
        let m = 16381u32;
        for n in [3usize, 10, 50] {
            let all = names(n);
            let before: Vec<String> = table(&all, m).iter().map(|i| all[*i].clone()).collect();
            let removed = all[n / 2].clone();
            let rest: Vec<String> = all.iter().filter(|s| **s != removed).cloned().collect();
            let after: Vec<String> = table(&rest, m).iter().map(|i| rest[*i].clone()).collect();
            let mut own = 0;
            let mut others = 0;
            for (b, a) in before.iter().zip(&after) {
                if *b == removed {
                    own += 1;
                } else if b != a {
                    others += 1;
                }
            }
            let minimum = m as usize / n;
            assert!(own >= minimum && own <= minimum + 1, "n={n}: own={own}");
            // Every entry of the removed backend moved (it is gone); of the others, at most
            // a small fraction of the table.
            assert!(after.iter().all(|a| *a != removed));
            assert!(
                others * 100 <= m as usize * 2,
                "n={n}: {others} other entries moved"
            );
            eprintln!("n={n}: {own} entries of the removed backend, {others} others moved");
        }
    }
}
