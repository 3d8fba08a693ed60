//! The reserved identities: fixed numbers with a meaning of their own, as in Cilium.

use std::fmt;

use cellium_labels::{Label, Labels, source};

use crate::identity::Identity;

/// A reserved identity. Each carries the label `reserved:<name>`; `world-ipv4` and
/// `world-ipv6` also carry `reserved:world`, so that selecting the world selects both
/// halves. They always exist and are never released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reserved {
    /// The node itself (and every address of its network namespace): 1.
    Host = 1,
    /// Everything outside the cluster that no prefix of the ipcache covers: 2.
    World = 2,
    /// Pods not managed by this agent: 3.
    Unmanaged = 3,
    /// The node's health endpoint: 4.
    Health = 4,
    /// Pods whose labels are not known yet: 5.
    Init = 5,
    /// Other nodes of the cluster: 6.
    RemoteNode = 6,
    /// The Kubernetes API server: 7.
    KubeApiserver = 7,
    /// The ingress proxy: 8.
    Ingress = 8,
    /// The IPv4 world (dual stack): 9.
    WorldIpv4 = 9,
    /// The IPv6 world (dual stack): 10.
    WorldIpv6 = 10,
}

impl Reserved {
    /// Every reserved identity, by number.
    pub const ALL: [Reserved; 10] = [
        Reserved::Host,
        Reserved::World,
        Reserved::Unmanaged,
        Reserved::Health,
        Reserved::Init,
        Reserved::RemoteNode,
        Reserved::KubeApiserver,
        Reserved::Ingress,
        Reserved::WorldIpv4,
        Reserved::WorldIpv6,
    ];

    /// The number.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name in its label, `reserved:<name>`.
    pub fn name(self) -> &'static str {
        match self {
            Reserved::Host => "host",
            Reserved::World => "world",
            Reserved::Unmanaged => "unmanaged",
            Reserved::Health => "health",
            Reserved::Init => "init",
            Reserved::RemoteNode => "remote-node",
            Reserved::KubeApiserver => "kube-apiserver",
            Reserved::Ingress => "ingress",
            Reserved::WorldIpv4 => "world-ipv4",
            Reserved::WorldIpv6 => "world-ipv6",
        }
    }

    /// The reserved identity numbered `id`.
    pub fn from_id(id: u32) -> Option<Reserved> {
        Reserved::ALL.into_iter().find(|r| r.id() == id)
    }

    /// The reserved identity named `name` (`host`, `world-ipv4`, ...).
    pub fn from_name(name: &str) -> Option<Reserved> {
        Reserved::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Its labels.
    pub fn labels(self) -> Labels {
        let mut labels = Labels::new();
        labels.insert(Label::reserved(self.name()));
        if matches!(self, Reserved::WorldIpv4 | Reserved::WorldIpv6) {
            labels.insert(Label::reserved(Reserved::World.name()));
        }
        labels
    }

    /// The identity.
    pub fn identity(self) -> Identity {
        Identity {
            id: self.id(),
            labels: self.labels(),
        }
    }

    /// Which reserved identity a label set stands for, as the allocator decides it:
    ///
    /// - a set holding `reserved:host` is the host, whatever else it holds (the node keeps
    ///   identity 1 when it gets labels of its own, as in Cilium);
    /// - a set equal to a reserved identity's labels is that identity, and so is a set of
    ///   the one label `reserved:<name>` (`reserved:world-ipv4` alone is 9);
    /// - any other set made only of `reserved:` labels is `Err(())`: no identity has it;
    /// - every other set is `Ok(None)`: it gets an allocated identity.
    #[allow(clippy::result_unit_err)]
    pub fn for_labels(labels: &Labels) -> Result<Option<Reserved>, ()> {
        if labels.contains(&Label::reserved(Reserved::Host.name())) {
            return Ok(Some(Reserved::Host));
        }
        if !labels.iter().all(|l| l.source == source::RESERVED) {
            return Ok(None);
        }
        if let Some(r) = Reserved::ALL.into_iter().find(|r| r.labels() == *labels) {
            return Ok(Some(r));
        }
        match labels.iter().collect::<Vec<_>>().as_slice() {
            [only] if only.value.is_empty() => Reserved::from_name(&only.key).map(Some).ok_or(()),
            _ => Err(()),
        }
    }
}

impl fmt::Display for Reserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(s: &str) -> Labels {
        s.parse().unwrap()
    }

    #[test]
    fn numbers_and_names_are_ciliums() {
        let table: Vec<(u32, &str)> = Reserved::ALL.iter().map(|r| (r.id(), r.name())).collect();
        assert_eq!(
            table,
            vec![
                (1, "host"),
                (2, "world"),
                (3, "unmanaged"),
                (4, "health"),
                (5, "init"),
                (6, "remote-node"),
                (7, "kube-apiserver"),
                (8, "ingress"),
                (9, "world-ipv4"),
                (10, "world-ipv6"),
            ]
        );
        for r in Reserved::ALL {
            assert_eq!(Reserved::from_id(r.id()), Some(r));
            assert_eq!(Reserved::from_name(r.name()), Some(r));
        }
        assert_eq!(Reserved::from_id(11), None);
    }

    #[test]
    fn world_halves_also_carry_world() {
        assert_eq!(
            Reserved::WorldIpv4.labels().to_string(),
            "reserved:world,reserved:world-ipv4"
        );
        assert_eq!(Reserved::Host.labels().to_string(), "reserved:host");
    }

    #[test]
    fn label_sets_map_to_reserved_identities() {
        let r = |s: &str| Reserved::for_labels(&labels(s));
        assert_eq!(r("reserved:host"), Ok(Some(Reserved::Host)));
        assert_eq!(r("reserved:host,k8s:node=a"), Ok(Some(Reserved::Host)));
        assert_eq!(r("reserved:world"), Ok(Some(Reserved::World)));
        assert_eq!(
            r("reserved:world,reserved:world-ipv6"),
            Ok(Some(Reserved::WorldIpv6))
        );
        assert_eq!(r("reserved:world-ipv4"), Ok(Some(Reserved::WorldIpv4)));
        assert_eq!(r("reserved:init"), Ok(Some(Reserved::Init)));
        assert_eq!(r("reserved:nothing"), Err(()));
        assert_eq!(r("reserved:world,reserved:health"), Err(()));
        assert_eq!(r("k8s:app=web"), Ok(None));
        assert_eq!(r("cidr:10.0.0.0/8,reserved:world"), Ok(None));
    }
}
