//! CIDR identities: one identity and one ipcache entry per prefix that rules name.
//!
//! A prefix's labels are `cidr:<prefix>`, the `cidr:` label of every other rule prefix
//! containing it, and `reserved:world` (see `Labels::for_cidr`); so when a rule adds a
//! wider prefix, the narrower ones get new labels and new identities. Each identity is
//! claimed in the ipcache with `Source::Policy`, so the datapath resolves addresses inside
//! the prefix to it (a pod's or the node's own entry takes precedence), and released when no
//! rule names the prefix any more.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use cellium_identity::{Identities, Identity};
use cellium_ipcache::{Ipcache, Source};
use cellium_labels::{Label, Labels};
use ipnet::IpNet;
use std::sync::Arc;

/// What a reconciliation changed.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// Identities now in use (new, or with new labels).
    pub added: Vec<Arc<Identity>>,
    /// Identities no longer in use that are gone, with the labels they had.
    pub removed: Vec<(u32, Labels)>,
    /// What failed, as messages for the cell's health.
    pub errors: Vec<String>,
}

/// The identities held for rule prefixes.
#[derive(Debug, Default)]
pub struct CidrIdentities {
    held: BTreeMap<IpNet, (Labels, u32)>,
}

/// The labels of `prefix` among `all` rule prefixes.
pub fn labels_for(prefix: IpNet, all: &BTreeSet<IpNet>) -> Labels {
    let mut labels = Labels::for_cidr(prefix);
    for outer in all {
        if *outer != prefix && outer.contains(&prefix) {
            labels.insert(Label::cidr(*outer));
        }
    }
    labels
}

/// The `cidr:` labels of the prefixes in `prefixes` that contain `ip`.
pub fn labels_containing(ip: IpAddr, prefixes: &BTreeSet<IpNet>) -> Vec<Label> {
    prefixes
        .iter()
        .filter(|p| p.contains(&ip))
        .map(|p| Label::cidr(*p))
        .collect()
}

impl CidrIdentities {
    /// Holds an identity (and an ipcache claim) for exactly the prefixes of `wanted`.
    /// New identities are taken before old ones are given back, so an address never falls
    /// back to `world` while a prefix's labels change.
    pub fn reconcile(
        &mut self,
        wanted: &BTreeSet<IpNet>,
        identities: &Identities,
        ipcache: Option<&Ipcache>,
    ) -> Reconciled {
        let mut out = Reconciled::default();
        let mut release = Vec::new();
        for prefix in wanted {
            let labels = labels_for(*prefix, wanted);
            if self.held.get(prefix).is_some_and(|(l, _)| *l == labels) {
                continue;
            }
            let identity = match identities.allocate(&labels) {
                Ok(identity) => identity,
                Err(e) => {
                    out.errors
                        .push(format!("no identity for CIDR {prefix}: {e}"));
                    continue;
                }
            };
            if let Some(ipc) = ipcache
                && let Err(e) = ipc.upsert(*prefix, identity.id, Source::Policy)
            {
                out.errors
                    .push(format!("ipcache entry for CIDR {prefix}: {e}"));
            }
            if let Some(old) = self.held.insert(*prefix, (labels, identity.id)) {
                release.push(old);
            }
            out.added.push(identity);
        }
        let gone: Vec<IpNet> = self
            .held
            .keys()
            .filter(|p| !wanted.contains(p))
            .copied()
            .collect();
        for prefix in gone {
            if let Some(old) = self.held.remove(&prefix) {
                if let Some(ipc) = ipcache
                    && let Err(e) = ipc.delete(prefix, Source::Policy)
                {
                    out.errors
                        .push(format!("ipcache entry for CIDR {prefix}: {e}"));
                }
                release.push(old);
            }
        }
        for (labels, id) in release {
            if identities.release(id) {
                out.removed.push((id, labels));
            }
        }
        out
    }

    /// The identity held for `prefix`.
    #[cfg(test)]
    pub fn get(&self, prefix: &IpNet) -> Option<u32> {
        self.held.get(prefix).map(|(_, id)| *id)
    }

    /// Every prefix with its identity.
    pub fn list(&self) -> Vec<(IpNet, u32)> {
        self.held.iter().map(|(p, (_, id))| (*p, *id)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(prefixes: &[&str]) -> BTreeSet<IpNet> {
        prefixes.iter().map(|p| p.parse().unwrap()).collect()
    }

    #[test]
    fn labels_name_the_containing_prefixes() {
        let all = set(&["10.0.0.0/8", "10.1.0.0/16", "192.168.0.0/16"]);
        let l = labels_for("10.1.0.0/16".parse().unwrap(), &all);
        assert!(l.contains(&Label::cidr("10.0.0.0/8".parse().unwrap())));
        assert!(l.contains(&Label::cidr("10.1.0.0/16".parse().unwrap())));
        assert!(!l.contains(&Label::cidr("192.168.0.0/16".parse().unwrap())));
        assert!(l.contains(&Label::reserved("world")));
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(labels_containing(ip, &all).len(), 2);
    }

    #[test]
    fn identities_and_ipcache_follow_the_prefixes() {
        let ids = Identities::in_memory();
        let ipc = Ipcache::in_memory();
        let mut c = CidrIdentities::default();
        let r = c.reconcile(&set(&["10.1.0.0/16"]), &ids, Some(&ipc));
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let narrow = c.get(&"10.1.0.0/16".parse().unwrap()).unwrap();
        assert_eq!(ipc.lookup("10.1.2.3".parse().unwrap()).unwrap().1, narrow);
        // A wider prefix gives the narrow one a new label set, so a new identity.
        let r = c.reconcile(&set(&["10.0.0.0/8", "10.1.0.0/16"]), &ids, Some(&ipc));
        assert_eq!(r.added.len(), 2);
        assert_eq!(r.removed.len(), 1);
        let narrow2 = c.get(&"10.1.0.0/16".parse().unwrap()).unwrap();
        assert_ne!(narrow, narrow2);
        assert!(ids.get(narrow).is_none());
        assert_eq!(ipc.lookup("10.1.2.3".parse().unwrap()).unwrap().1, narrow2);
        let wide = c.get(&"10.0.0.0/8".parse().unwrap()).unwrap();
        assert_eq!(ipc.lookup("10.2.0.1".parse().unwrap()).unwrap().1, wide);
        let r = c.reconcile(&BTreeSet::new(), &ids, Some(&ipc));
        assert_eq!(r.removed.len(), 2);
        assert!(ipc.lookup("10.2.0.1".parse().unwrap()).is_none());
        assert!(c.list().is_empty());
    }
}
