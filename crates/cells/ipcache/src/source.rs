//! Who claims a prefix, and which claim wins.

use std::fmt;
use std::str::FromStr;

/// The owner of a claim on a prefix. When several claim the same prefix, the one of highest
/// precedence is in effect: [`Endpoint`](Source::Endpoint) > [`Host`](Source::Host) >
/// [`Remote`](Source::Remote) > [`Policy`](Source::Policy); the others wait underneath and
/// take over when it is deleted. (What this node sees of itself beats what the cluster says
/// of others: a stale CiliumEndpoint of another node never hides a local pod.)
///
/// The order of the variants is the precedence, lowest first, so `Ord` compares precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// A CIDR prefix of a network policy (the policy repository).
    Policy,
    /// Another node's pod or the other node itself, learnt from the cluster.
    Remote,
    /// One of the node's own addresses (read from the node's network namespace).
    Host,
    /// A local pod's address (the endpoint manager).
    Endpoint,
}

impl Source {
    /// Every source, highest precedence first.
    pub const BY_PRECEDENCE: [Source; 4] = [
        Source::Endpoint,
        Source::Host,
        Source::Remote,
        Source::Policy,
    ];

    /// The source's name: `endpoint`, `host`, `remote` or `policy`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Endpoint => "endpoint",
            Source::Host => "host",
            Source::Remote => "remote",
            Source::Policy => "policy",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Source, String> {
        Source::BY_PRECEDENCE
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                format!("unknown ipcache source {s:?} (endpoint, host, remote or policy)")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_beats_host_beats_policy() {
        assert!(Source::Endpoint > Source::Host);
        assert!(Source::Host > Source::Policy);
        let mut all = Source::BY_PRECEDENCE;
        all.sort();
        all.reverse();
        assert_eq!(all, Source::BY_PRECEDENCE);
        for s in all {
            assert_eq!(s.name().parse::<Source>(), Ok(s));
        }
        assert!("pod".parse::<Source>().is_err());
    }
}
