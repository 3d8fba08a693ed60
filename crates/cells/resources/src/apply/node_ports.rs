//! Node ports, decided as the API server's allocator decides them (standalone mode; in
//! Kubernetes mode the API server has decided them already).
//!
//! A port of a NodePort service (or of a LoadBalancer service that allocates node ports)
//! keeps the node port the document gives, which must be inside `node-port-range` and held by
//! no other service; one left out keeps the one the service already has for that port (same
//! name and protocol), or is allocated. A LoadBalancer service with `externalTrafficPolicy:
//! Local` gets its `healthCheckNodePort` the same way. Ports of one service may share a number
//! across protocols, as the API server allows.
//!
//! Allocation is deterministic: the search starts at a point derived from the service's
//! namespace, name, port name and protocol (FNV-1a over them), and takes the first free port
//! from there, wrapping around. What is allocated is written into the document, so that the
//! recorded object (the state directory) brings the same ports back after a restart, as
//! cluster IPs are; the deterministic start only makes a service deleted and applied again
//! likely to get the same ports.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_yaml::Value;

use crate::resources::Resources;
use cellium_k8s_objects::Protocol;
use cellium_k8s_objects::service::ServiceDraft;
use cellium_k8s_objects::validate::FieldError;
use cellium_k8s_objects::{Object, ObjectKey};

/// `node-port-range`: the inclusive range node ports come from (default `30000-32767`, as
/// the API server's `--service-node-port-range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePortRange {
    /// The first port.
    pub first: u16,
    /// The last port.
    pub last: u16,
}

impl Default for NodePortRange {
    fn default() -> Self {
        NodePortRange {
            first: 30000,
            last: 32767,
        }
    }
}

impl NodePortRange {
    /// Whether `port` is inside.
    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }

    fn size(&self) -> u32 {
        u32::from(self.last - self.first) + 1
    }
}

impl fmt::Display for NodePortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for NodePortRange {
    type Err = String;

    /// `30000-32767`, or Cilium's `30000,32767`.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a port range (FIRST-LAST, e.g. 30000-32767)");
        let (a, b) = text
            .split_once('-')
            .or_else(|| text.split_once(','))
            .ok_or_else(bad)?;
        let first: u16 = a.trim().parse().map_err(|_| bad())?;
        let last: u16 = b.trim().parse().map_err(|_| bad())?;
        if first == 0 || first > last {
            return Err(format!(
                "{text:?}: the first port must be at least 1 and not above the last"
            ));
        }
        Ok(NodePortRange { first, last })
    }
}

impl Serialize for NodePortRange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for NodePortRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Every node port held, by number, with its service.
pub(crate) type NodePortsInUse = BTreeMap<u16, ObjectKey>;

impl Resources {
    /// The node ports the table's services hold.
    pub(crate) fn node_ports_in_use(&self) -> NodePortsInUse {
        let mut out = BTreeMap::new();
        for svc in self.services.list() {
            let held = svc.ports.iter().filter_map(|p| p.node_port);
            for port in held.chain(svc.exposure.health_check_node_port) {
                out.insert(port, svc.key());
            }
        }
        out
    }

    /// Decides the draft's node ports and health check node port (see the module), writes
    /// them into the document and marks them used. `restoring` accepts a recorded port
    /// outside a range that has changed since, with a warning.
    pub(crate) fn settle_node_ports(
        &self,
        draft: &mut ServiceDraft,
        value: &mut Value,
        used: &mut NodePortsInUse,
        restoring: bool,
    ) -> Result<(), FieldError> {
        let key = draft.service.key();
        let current = self.services.get(&key);
        let range = self.node_port_range;
        let exposure = draft.service.exposure.clone();
        let ports = &draft.service.ports;
        // Given ports first, so that an allocation never takes a number a later port names.
        let mut decided: Vec<Option<u16>> = Vec::with_capacity(ports.len());
        for (i, port) in ports.iter().enumerate() {
            let field = format!("spec.ports[{i}].nodePort");
            decided.push(match port.node_port {
                Some(given) => Some(check(&field, &key, given, range, used, restoring)?),
                None => None,
            });
        }
        let mut mine: BTreeSet<u16> = decided.iter().flatten().copied().collect();
        // Another service's, or already this one's for another port.
        let taken = |p: u16, mine: &BTreeSet<u16>| {
            mine.contains(&p) || used.get(&p).is_some_and(|holder| *holder != key)
        };
        for (i, port) in ports.iter().enumerate() {
            if decided[i].is_some() || !exposure.allocates_node_ports() {
                continue;
            }
            let kept = current
                .as_ref()
                .and_then(|c| {
                    c.ports
                        .iter()
                        .find(|p| p.name == port.name && p.protocol == port.protocol)
                        .and_then(|p| p.node_port)
                })
                .filter(|k| !taken(*k, &mine));
            let field = format!("spec.ports[{i}].nodePort");
            let chosen = match kept {
                Some(k) => k,
                None => allocate(&field, &port.name, port.protocol, &key, range, |p| {
                    used.contains_key(&p) || mine.contains(&p)
                })?,
            };
            mine.insert(chosen);
            decided[i] = Some(chosen);
        }
        let free = |p: u16, mine: &BTreeSet<u16>| !used.contains_key(&p) && !mine.contains(&p);
        let kept = current
            .as_ref()
            .and_then(|c| c.exposure.health_check_node_port)
            .filter(|k| !taken(*k, &mine));
        let health = health_port(&exposure, &key, kept, range, used, restoring, |p| {
            !free(p, &mine)
        })?;
        if let Some(port) = health.filter(|p| mine.contains(p)) {
            return Err(FieldError::new(
                "spec.healthCheckNodePort",
                format!(
                    "{port}: provided port is already allocated (to a node port of this service)"
                ),
            ));
        }
        // This service's old ports are freed (those the table holds: a text names a service
        // once), its new ones taken.
        if let Some(c) = &current {
            let old = c.ports.iter().filter_map(|p| p.node_port);
            for port in old.chain(c.exposure.health_check_node_port) {
                if used.get(&port) == Some(&key) {
                    used.remove(&port);
                }
            }
        }
        for port in decided.iter().flatten().chain(health.iter()) {
            used.insert(*port, key.clone());
        }
        for (port, chosen) in draft.service.ports.iter_mut().zip(&decided) {
            port.node_port = *chosen;
        }
        draft.service.exposure.health_check_node_port = health;
        record(value, &decided, health);
        Ok(())
    }
}

/// The health check node port: given (checked), kept, or allocated when the service wants
/// one.
fn health_port(
    exposure: &cellium_k8s_objects::Exposure,
    key: &ObjectKey,
    kept: Option<u16>,
    range: NodePortRange,
    used: &NodePortsInUse,
    restoring: bool,
    taken: impl Fn(u16) -> bool,
) -> Result<Option<u16>, FieldError> {
    let field = "spec.healthCheckNodePort";
    Ok(match exposure.health_check_node_port {
        Some(given) => Some(check(field, key, given, range, used, restoring)?),
        None if exposure.wants_health_check() => Some(match kept {
            Some(k) => k,
            None => allocate(field, "health-check", Protocol::Tcp, key, range, taken)?,
        }),
        None => None,
    })
}

fn check(
    field: &str,
    key: &ObjectKey,
    port: u16,
    range: NodePortRange,
    used: &NodePortsInUse,
    restoring: bool,
) -> Result<u16, FieldError> {
    if !range.contains(port) {
        if !restoring {
            return Err(FieldError::new(
                field,
                format!(
                    "{port}: provided port is not in the valid range; the range of valid ports is {range} (node-port-range)"
                ),
            ));
        }
        tracing::warn!(service = %key, port, %range, "a recorded node port is outside node-port-range; kept, as the API server keeps it");
    }
    if let Some(holder) = used.get(&port).filter(|holder| *holder != key) {
        return Err(FieldError::new(
            field,
            format!("{port}: provided port is already allocated (to service {holder})"),
        ));
    }
    Ok(port)
}

/// The first free port from the service's start point (see the module).
fn allocate(
    field: &str,
    port_name: &str,
    protocol: Protocol,
    key: &ObjectKey,
    range: NodePortRange,
    taken: impl Fn(u16) -> bool,
) -> Result<u16, FieldError> {
    let seed = fnv1a(&[&key.to_string(), port_name, &protocol.to_string()]);
    let size = range.size();
    (0..size)
        .map(|step| range.first + ((seed.wrapping_add(step)) % size) as u16)
        .find(|p| !taken(*p))
        .ok_or_else(|| {
            FieldError::new(
                field,
                format!("no node port left in node-port-range {range}"),
            )
        })
}

fn fnv1a(parts: &[&str]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0)) {
            hash ^= u32::from(b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    }
    hash
}

/// Writes the decision into the document, as the API server returns it.
fn record(value: &mut Value, decided: &[Option<u16>], health: Option<u16>) {
    let Some(spec) = value
        .as_mapping_mut()
        .and_then(|root| root.get_mut("spec"))
        .and_then(Value::as_mapping_mut)
    else {
        return;
    };
    if let Some(port) = health {
        spec.insert("healthCheckNodePort".into(), Value::from(port));
    }
    let Some(ports) = spec.get_mut("ports").and_then(Value::as_sequence_mut) else {
        return;
    };
    for (entry, chosen) in ports.iter_mut().zip(decided) {
        if let (Some(map), Some(port)) = (entry.as_mapping_mut(), chosen) {
            map.insert("nodePort".into(), Value::from(*port));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_reads_both_forms_and_names_a_bad_one() {
        let r: NodePortRange = "30000-32767".parse().unwrap();
        assert_eq!(r, NodePortRange::default());
        assert_eq!("20000,20010".parse::<NodePortRange>().unwrap().size(), 11);
        assert!("32767-30000".parse::<NodePortRange>().is_err());
        let e = "ports".parse::<NodePortRange>().unwrap_err();
        assert!(e.contains("\"ports\""), "{e}");
    }

    #[test]
    fn allocation_is_deterministic_and_skips_ports_in_use() {
        let key = ObjectKey::namespaced("shop", "web");
        let range = NodePortRange {
            first: 30000,
            last: 30003,
        };
        let mut used = NodePortsInUse::new();
        let alloc = |used: &NodePortsInUse| {
            allocate(
                "spec.ports[0].nodePort",
                "http",
                Protocol::Tcp,
                &key,
                range,
                |p| used.contains_key(&p),
            )
        };
        let first = alloc(&used).unwrap();
        assert_eq!(alloc(&used).unwrap(), first);
        assert!(range.contains(first));
        let mut got = vec![first];
        used.insert(first, ObjectKey::namespaced("shop", "other"));
        for _ in 0..3 {
            let p = alloc(&used).unwrap();
            assert!(!got.contains(&p) && range.contains(p));
            got.push(p);
            used.insert(p, key.clone());
        }
        let e = alloc(&used).unwrap_err();
        assert_eq!(e.field, "spec.ports[0].nodePort");
        assert!(e.reason.contains("no node port left"), "{}", e.reason);
    }
}
