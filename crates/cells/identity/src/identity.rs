//! An identity: a number and the labels it stands for.

use std::fmt;
use std::ops::RangeInclusive;

use cellium_labels::Labels;
use serde::{Deserialize, Serialize};

use crate::reserved::Reserved;

/// The numbers allocated to label sets without a `cidr:` label (pods), as Cilium's
/// cluster-scope identities: 256 to 65535.
pub const CLUSTER_IDENTITIES: RangeInclusive<u32> = 256..=65535;

/// The bit that marks node-local identities (Cilium's `LocalIdentityFlag`).
pub const LOCAL_IDENTITY_FLAG: u32 = 1 << 24;

/// The numbers allocated to label sets with a `cidr:` label: node-local, from `1 << 24`
/// to `(1 << 25) - 1`.
pub const LOCAL_IDENTITIES: RangeInclusive<u32> =
    LOCAL_IDENTITY_FLAG..=(LOCAL_IDENTITY_FLAG << 1) - 1;

/// Where an identity's number comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// A fixed number with a meaning of its own ([`Reserved`]).
    Reserved,
    /// Allocated from [`CLUSTER_IDENTITIES`].
    Cluster,
    /// Allocated on this node from [`LOCAL_IDENTITIES`].
    Local,
}

impl Scope {
    /// The scope a number belongs to; `None` for numbers no identity can have (0, 11-255,
    /// 65536 to `1 << 24` - 1, and above the local range).
    pub fn of(id: u32) -> Option<Scope> {
        if Reserved::from_id(id).is_some() {
            Some(Scope::Reserved)
        } else if CLUSTER_IDENTITIES.contains(&id) {
            Some(Scope::Cluster)
        } else if LOCAL_IDENTITIES.contains(&id) {
            Some(Scope::Local)
        } else {
            None
        }
    }

    /// The scope labels are allocated in: local when they hold a `cidr:` label.
    pub fn for_labels(labels: &Labels) -> Scope {
        if labels.has_cidr() {
            Scope::Local
        } else {
            Scope::Cluster
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Reserved => "reserved",
            Scope::Cluster => "cluster",
            Scope::Local => "local",
        })
    }
}

/// A security identity: the number the datapath enforces policy against, and the labels
/// policies select it by. Immutable; shared as `Arc<Identity>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    /// The number.
    pub id: u32,
    /// The labels.
    pub labels: Labels,
}

impl Identity {
    /// The identity's scope (reserved, cluster or local).
    pub fn scope(&self) -> Scope {
        Scope::of(self.id).unwrap_or(Scope::Cluster)
    }

    /// Whether this is a reserved identity.
    pub fn is_reserved(&self) -> bool {
        Reserved::from_id(self.id).is_some()
    }

    /// Whether this is a node-local identity (a CIDR's).
    pub fn is_local(&self) -> bool {
        LOCAL_IDENTITIES.contains(&self.id)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.id, self.labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_have_scopes() {
        assert_eq!(Scope::of(1), Some(Scope::Reserved));
        assert_eq!(Scope::of(10), Some(Scope::Reserved));
        assert_eq!(Scope::of(0), None);
        assert_eq!(Scope::of(11), None);
        assert_eq!(Scope::of(256), Some(Scope::Cluster));
        assert_eq!(Scope::of(65535), Some(Scope::Cluster));
        assert_eq!(Scope::of(65536), None);
        assert_eq!(Scope::of(16_777_216), Some(Scope::Local));
        assert_eq!(Scope::of(33_554_431), Some(Scope::Local));
        assert_eq!(Scope::of(33_554_432), None);
    }

    #[test]
    fn cidr_labels_make_local_identities() {
        let cidr = Labels::for_cidr("10.0.0.0/8".parse().unwrap());
        assert_eq!(Scope::for_labels(&cidr), Scope::Local);
        let pod: Labels = "k8s:app=web".parse().unwrap();
        assert_eq!(Scope::for_labels(&pod), Scope::Cluster);
    }
}
