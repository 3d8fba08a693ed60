//! The kernel's TCP counters of a pod's network namespace (`/proc/net/snmp` `Tcp`,
//! `/proc/net/netstat` `TcpExt`), read across a restart: how many segments were sent again,
//! and why.

use std::collections::BTreeMap;

use anyhow::Result;
use cellium_integration::NetNs;

/// Every `Tcp` and `TcpExt` counter of a namespace, as `Tcp.RetransSegs`, `TcpExt.TCPLossProbes`.
#[derive(Debug, Clone, Default)]
pub struct TcpCounters(BTreeMap<String, u64>);

impl TcpCounters {
    /// Reads them inside `ns` (a process started there sees the namespace's `/proc/net`).
    pub fn read(ns: &NetNs) -> Result<TcpCounters> {
        let text = ns.exec("cat", &["/proc/net/snmp", "/proc/net/netstat"])?;
        Ok(TcpCounters(parse(&text)))
    }

    /// Segments retransmitted (`Tcp.RetransSegs`).
    pub fn retransmitted(&self) -> u64 {
        self.0.get("Tcp.RetransSegs").copied().unwrap_or(0)
    }

    /// The counters that say why segments were sent again (`RetransSegs` and the `TcpExt`
    /// counters of loss, probes, timeouts and retransmissions) that grew since `before`, as
    /// `name +n`.
    pub fn grown_since(&self, before: &TcpCounters) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| {
                *k == "Tcp.RetransSegs"
                    || (k.starts_with("TcpExt.")
                        && ["Retrans", "Loss", "Timeout", "Probe"]
                            .iter()
                            .any(|w| k.contains(w)))
            })
            .filter_map(|(k, v)| {
                let grew = v.saturating_sub(before.0.get(k).copied().unwrap_or(0));
                (grew > 0).then(|| format!("{k} +{grew}"))
            })
            .collect()
    }
}

/// `Proto: names...` followed by `Proto: values...`, for `Tcp` and `TcpExt`.
fn parse(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.windows(2) {
        let (Some((proto, names)), Some((again, values))) =
            (pair[0].split_once(':'), pair[1].split_once(':'))
        else {
            continue;
        };
        if proto != again || !matches!(proto, "Tcp" | "TcpExt") {
            continue;
        }
        // The names line is the one whose first field is not a number.
        if names
            .split_whitespace()
            .next()
            .is_none_or(|n| n.parse::<i64>().is_ok())
        {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = v.parse() {
                out.insert(format!("{proto}.{n}"), v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_and_tcpext_counters_are_read() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RetransSegs MaxConn\nTcp: 1 7 -1\nTcpExt: SyncookiesSent TCPLossProbes TCPTimeouts\nTcpExt: 0 3 1\n";
        let now = TcpCounters(parse(text));
        assert_eq!(now.retransmitted(), 7);
        let before = TcpCounters(parse(
            "Tcp: RtoAlgorithm RetransSegs MaxConn\nTcp: 1 5 -1\nTcpExt: SyncookiesSent TCPLossProbes TCPTimeouts\nTcpExt: 0 3 0\n",
        ));
        assert_eq!(
            now.grown_since(&before),
            vec!["Tcp.RetransSegs +2", "TcpExt.TCPTimeouts +1"]
        );
    }
}
