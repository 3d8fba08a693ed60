//! Translating each source kind into the rule model, with the kind's own semantics.
//!
//! - [`network_policy`]: Kubernetes NetworkPolicy, as the upstream e2e suite expects.
//! - [`cilium`]: CiliumNetworkPolicy and CiliumClusterwideNetworkPolicy, as Cilium does.
//!
//! Objects reach here validated by `resources`; what can still fail is what only the label
//! model sees (a namespace label key that grows past a label key's length once prefixed).
//! Such a policy is refused as a whole and reported on the cell's health.

pub mod cilium;
pub mod deps;
pub mod network_policy;

use cellium_labels::{Label, Operator, Requirement, Selector};
use cellium_policy::Protocol;
use cellium_resources::{CidrBlock, LabelSelector, PolicyPort, PortRef, SelectorOperator};
use ipnet::IpNet;

use crate::rule::{PortMatch, PortSpec};

/// Fewer policies than this are translated on the calling thread: a thread costs more than
/// translating them.
const PARALLEL_MIN: usize = 256;

/// `translate` applied to every policy, in order, spread over the machine's cores. At a start
/// with thousands of policies, translating them one after the other was most of the
/// repository's first sync, which the endpoints wait for; each policy translates on its own.
/// A panic in `translate` is passed on.
pub fn all<T: Sync, R: Send>(policies: &[T], translate: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = policies.len().div_ceil(threads).max(PARALLEL_MIN);
    if policies.len() <= chunk {
        return policies.iter().map(&translate).collect();
    }
    std::thread::scope(|scope| {
        let translate = &translate;
        let parts: Vec<_> = policies
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(translate).collect::<Vec<R>>()))
            .collect();
        parts
            .into_iter()
            .flat_map(|part| part.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// A label selector with every key rewritten by `key` (which adds the source prefix the
/// kind implies).
pub fn selector(sel: &LabelSelector, key: impl Fn(&str) -> String) -> Result<Selector, String> {
    let mut reqs = Vec::new();
    for (k, v) in &sel.match_labels {
        reqs.push(Requirement::equals(&key(k), v).map_err(|e| e.to_string())?);
    }
    for r in &sel.match_expressions {
        let op = match r.operator {
            SelectorOperator::In => Operator::In,
            SelectorOperator::NotIn => Operator::NotIn,
            SelectorOperator::Exists => Operator::Exists,
            SelectorOperator::DoesNotExist => Operator::DoesNotExist,
        };
        reqs.push(
            Requirement::new(&key(&r.key), op, r.values.iter().cloned())
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(Selector::new(reqs))
}

/// `key DoesNotExist`.
pub fn absent(key: &str) -> Result<Requirement, String> {
    Requirement::new(key, Operator::DoesNotExist, None::<String>).map_err(|e| e.to_string())
}

/// `key Exists`.
pub fn present(key: &str) -> Result<Requirement, String> {
    Requirement::exists(key).map_err(|e| e.to_string())
}

/// The identities of a CIDR block: a `cidr:` label inside the block and none inside any
/// exception (the `cidr:` key matches every prefix inside its own).
pub fn cidr_block(block: &CidrBlock) -> Result<Selector, String> {
    let mut sel = Selector::cidr(block.cidr);
    for e in &block.except {
        sel = sel.and(Selector::new([absent(&Label::cidr(*e).to_string())?]));
    }
    Ok(sel)
}

/// Every prefix a block names.
pub fn block_prefixes(block: &CidrBlock) -> impl Iterator<Item = IpNet> + '_ {
    std::iter::once(block.cidr).chain(block.except.iter().copied())
}

/// The datapath's protocol for a Kubernetes protocol.
pub fn protocol(p: cellium_resources::Protocol) -> Protocol {
    match p {
        cellium_resources::Protocol::Tcp => Protocol::Tcp,
        cellium_resources::Protocol::Udp => Protocol::Udp,
        cellium_resources::Protocol::Sctp => Protocol::Sctp,
    }
}

/// The port entries of a rule.
pub fn ports(ports: &[PolicyPort]) -> Vec<PortSpec> {
    ports
        .iter()
        .map(|p| PortSpec {
            protocol: p.protocol.map(protocol),
            ports: match (&p.port, p.end_port) {
                (None, _) => PortMatch::All,
                (Some(PortRef::Number(n)), Some(end)) => PortMatch::Range(*n, end),
                (Some(PortRef::Number(n)), None) => PortMatch::Range(*n, *n),
                (Some(PortRef::Name(name)), _) => PortMatch::Named(name.clone()),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_labels::Labels;

    #[test]
    fn all_keeps_the_order_of_the_policies_however_they_are_split() {
        for n in [0, 1, PARALLEL_MIN, PARALLEL_MIN + 1, 10 * PARALLEL_MIN + 7] {
            let policies: Vec<usize> = (0..n).collect();
            let doubled = all(&policies, |p| 2 * p);
            assert_eq!(doubled, (0..n).map(|p| 2 * p).collect::<Vec<_>>(), "{n}");
        }
    }

    #[test]
    #[should_panic(expected = "policy 900")]
    fn all_passes_a_panic_on() {
        let policies: Vec<usize> = (0..1000).collect();
        all(&policies, |p| assert_ne!(*p, 900, "policy {p}"));
    }

    #[test]
    fn blocks_select_inside_but_not_the_exceptions() {
        let block = CidrBlock {
            cidr: "10.0.0.0/8".parse().unwrap(),
            except: vec!["10.1.0.0/16".parse().unwrap()],
        };
        let sel = cidr_block(&block).unwrap();
        let inside = Labels::for_cidr("10.2.0.0/16".parse().unwrap());
        let excepted = Labels::for_cidr("10.1.2.0/24".parse().unwrap());
        let outside = Labels::for_cidr("11.0.0.0/8".parse().unwrap());
        assert!(sel.matches(&inside));
        assert!(!sel.matches(&excepted));
        assert!(!sel.matches(&outside));
    }
}
