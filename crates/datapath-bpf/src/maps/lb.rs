//! ClusterIP maps, one set per family: `cel_lb4_services` / `cel_lb6_services` (frontend
//! slots), `cel_lb4_backends` / `cel_lb6_backends` and `cel_lb4_revnat` / `cel_lb6_revnat`.
//! A frontend, a backend and a rev-NAT entry live in the maps of their address's family;
//! backend ids and rev-NAT ids are one space over both.
//!
//! Trap: a service's slots reference backend ids, so write backends first, and keep a rev-NAT
//! entry until the service's connections are gone (deleting it makes replies arrive from the
//! backend's own address). A frontend's backends must be of its family: a slot naming an id
//! of the other family's map finds no backend.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};

use libbpf_rs::MapCore;

use crate::abi::{
    Lb4Backend, Lb4Key, Lb4ReverseNat, Lb4Service, Lb6Backend, Lb6Key, Lb6ReverseNat, be32, ipv4_of,
};
use crate::error::{Error, Result};
use crate::maps::TypedMap;
use crate::types::Protocol;

/// The IPv4 services map name.
pub const SERVICES: &str = "cel_lb4_services";
/// The IPv4 backends map name.
pub const BACKENDS: &str = "cel_lb4_backends";
/// The IPv4 reverse NAT map name.
pub const REVNAT: &str = "cel_lb4_revnat";
/// The IPv6 services map name.
pub const SERVICES6: &str = "cel_lb6_services";
/// The IPv6 backends map name.
pub const BACKENDS6: &str = "cel_lb6_backends";
/// The IPv6 reverse NAT map name.
pub const REVNAT6: &str = "cel_lb6_revnat";

/// Slot 0 flag (`CEL_SVC_F_EXTERNAL`): the frontend is reached from outside the node too
/// (NodePort, external IP, load balancer ingress IP), so `cel_from_netdev` translates it.
pub const SERVICE_EXTERNAL: u8 = 1 << 0;
/// Slot 0 flag (`CEL_SVC_F_LOCAL`): `externalTrafficPolicy: Local`, the client's address is
/// kept; without it a client from outside is source-translated to the frontend's address.
pub const SERVICE_LOCAL: u8 = 1 << 1;
/// Slot 0 flag (`CEL_SVC_F_SOURCE_RANGE`): a load balancer ingress IP of a service with
/// `loadBalancerSourceRanges`; a new connection is admitted only from a client its rev-NAT
/// id lists in the source range maps ([`crate::SourceRanges`]).
pub const SERVICE_SOURCE_RANGE: u8 = 1 << 2;

/// A service frontend: what clients connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frontend {
    /// The virtual IP (its family says the maps).
    pub vip: IpAddr,
    /// The port (host order).
    pub port: u16,
    /// TCP or UDP.
    pub protocol: Protocol,
}

/// A backend address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Backend {
    /// The backend's address (its family says the map).
    pub addr: IpAddr,
    /// Its port (host order).
    pub port: u16,
    /// TCP or UDP.
    pub protocol: Protocol,
}

/// A service as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    /// The reverse NAT id replies are translated with.
    pub rev_nat_id: u16,
    /// Backend ids, slot 1 first.
    pub backend_ids: Vec<u32>,
    /// The session affinity timeout in seconds; 0 = none.
    pub affinity_timeout: u32,
    /// [`SERVICE_EXTERNAL`], [`SERVICE_LOCAL`].
    pub flags: u8,
}

/// A frontend's key in the services map of its family.
enum Key {
    V4(Lb4Key),
    V6(Lb6Key),
}

impl Frontend {
    fn key(&self, slot: u16) -> Key {
        match self.vip {
            IpAddr::V4(vip) => Key::V4(Lb4Key {
                vip: be32(vip),
                dport: self.port.to_be(),
                slot,
                protocol: self.protocol.number(),
                pad: [0; 3],
            }),
            IpAddr::V6(vip) => Key::V6(Lb6Key {
                vip: vip.octets(),
                dport: self.port.to_be(),
                slot,
                protocol: self.protocol.number(),
                pad: [0; 3],
            }),
        }
    }

    fn from_key4(k: &Lb4Key) -> Self {
        Self {
            vip: ipv4_of(k.vip).into(),
            port: u16::from_be(k.dport),
            protocol: Protocol::from(k.protocol),
        }
    }

    fn from_key6(k: &Lb6Key) -> Self {
        Self {
            vip: Ipv6Addr::from(k.vip).into(),
            port: u16::from_be(k.dport),
            protocol: Protocol::from(k.protocol),
        }
    }
}

fn backend4(b: &Lb4Backend) -> Backend {
    Backend {
        addr: ipv4_of(b.addr).into(),
        port: u16::from_be(b.port),
        protocol: Protocol::from(b.protocol),
    }
}

fn backend6(b: &Lb6Backend) -> Backend {
    Backend {
        addr: Ipv6Addr::from(b.addr).into(),
        port: u16::from_be(b.port),
        protocol: Protocol::from(b.protocol),
    }
}

/// The slots of one frontend as read from its services map.
#[derive(Default)]
struct FrontendSlots {
    head: Option<Lb4Service>,
    backends: HashMap<u16, u32>,
}

impl FrontendSlots {
    fn add(&mut self, slot: u16, value: Lb4Service) {
        if slot == 0 {
            self.head = Some(value);
        } else {
            self.backends.insert(slot, value.backend_id);
        }
    }

    /// The service, as [`Services::service`] reads it: slots 1 to slot 0's count that exist
    /// (slots past the count are left-overs being removed); none without slot 0.
    fn entry(self) -> Option<ServiceEntry> {
        let head = self.head?;
        Some(ServiceEntry {
            rev_nat_id: head.rev_nat_id,
            backend_ids: (1..=head.count)
                .filter_map(|slot| self.backends.get(&slot).copied())
                .collect(),
            affinity_timeout: head.backend_id,
            flags: head.flags,
        })
    }
}

/// The maps of one family.
#[derive(Debug)]
pub(crate) struct FamilyMaps<K, B, R> {
    pub(crate) services: TypedMap<K, Lb4Service>,
    pub(crate) backends: TypedMap<u32, B>,
    pub(crate) revnat: TypedMap<u16, R>,
}

/// The load-balancing maps of both families.
#[derive(Debug)]
pub struct Services {
    v4: FamilyMaps<Lb4Key, Lb4Backend, Lb4ReverseNat>,
    v6: FamilyMaps<Lb6Key, Lb6Backend, Lb6ReverseNat>,
}

impl Services {
    pub(crate) fn new(
        v4: FamilyMaps<Lb4Key, Lb4Backend, Lb4ReverseNat>,
        v6: FamilyMaps<Lb6Key, Lb6Backend, Lb6ReverseNat>,
    ) -> Self {
        Self { v4, v6 }
    }

    fn slot(&self, frontend: &Frontend, slot: u16) -> Result<Option<Lb4Service>> {
        match frontend.key(slot) {
            Key::V4(k) => self.v4.services.get(&k),
            Key::V6(k) => self.v6.services.get(&k),
        }
    }

    fn put_slot(&self, frontend: &Frontend, slot: u16, value: &Lb4Service) -> Result<()> {
        match frontend.key(slot) {
            Key::V4(k) => self.v4.services.put(&k, value),
            Key::V6(k) => self.v6.services.put(&k, value),
        }
    }

    fn delete_slot(&self, frontend: &Frontend, slot: u16) -> Result<bool> {
        match frontend.key(slot) {
            Key::V4(k) => self.v4.services.delete(&k),
            Key::V6(k) => self.v6.services.delete(&k),
        }
    }

    /// Adds or replaces backend `id`, in the map of its address's family.
    pub fn put_backend(&self, id: u32, backend: &Backend) -> Result<()> {
        let (port, protocol) = (backend.port.to_be(), backend.protocol.number());
        match backend.addr {
            IpAddr::V4(addr) => self.v4.backends.put(
                &id,
                &Lb4Backend {
                    addr: be32(addr),
                    port,
                    protocol,
                    flags: 0,
                },
            ),
            IpAddr::V6(addr) => self.v6.backends.put(
                &id,
                &Lb6Backend {
                    addr: addr.octets(),
                    port,
                    protocol,
                    flags: 0,
                },
            ),
        }
    }

    /// Backend `id`, of either family.
    pub fn backend(&self, id: u32) -> Result<Option<Backend>> {
        if let Some(b) = self.v4.backends.get(&id)? {
            return Ok(Some(backend4(&b)));
        }
        Ok(self.v6.backends.get(&id)?.map(|b| backend6(&b)))
    }

    /// Removes backend `id` (of either family); connections pinned to it choose again.
    pub fn delete_backend(&self, id: u32) -> Result<bool> {
        let v4 = self.v4.backends.delete(&id)?;
        let v6 = self.v6.backends.delete(&id)?;
        Ok(v4 || v6)
    }

    /// Every backend of both families.
    pub fn backends(&self) -> Result<BTreeMap<u32, Backend>> {
        let mut out: BTreeMap<u32, Backend> = self
            .v4
            .backends
            .entries()?
            .into_iter()
            .map(|(id, b)| (id, backend4(&b)))
            .collect();
        out.extend(
            self.v6
                .backends
                .entries()?
                .into_iter()
                .map(|(id, b)| (id, backend6(&b))),
        );
        Ok(out)
    }

    /// Adds or replaces a service: its reverse NAT entry, then the backend slots, then slot 0
    /// with the count, then slots past the new count are removed, so the datapath never
    /// picks a slot that does not exist. Everything goes to the maps of the frontend's family.
    pub fn put_service(
        &self,
        frontend: &Frontend,
        rev_nat_id: u16,
        backend_ids: &[u32],
    ) -> Result<()> {
        self.put_service_with(frontend, rev_nat_id, backend_ids, 0)
    }

    /// [`put_service`](Self::put_service) with slot 0's `flags` ([`SERVICE_EXTERNAL`],
    /// [`SERVICE_LOCAL`]).
    pub fn put_service_with(
        &self,
        frontend: &Frontend,
        rev_nat_id: u16,
        backend_ids: &[u32],
        flags: u8,
    ) -> Result<()> {
        if !matches!(frontend.protocol, Protocol::Tcp | Protocol::Udp) {
            return Err(Error::invalid(
                format!("service {frontend:?}"),
                "only TCP and UDP are load-balanced",
            ));
        }
        if rev_nat_id == 0 {
            return Err(Error::invalid(
                format!("service {frontend:?}"),
                "rev-NAT id 0 means none",
            ));
        }
        let count = u16::try_from(backend_ids.len())
            .ok()
            .filter(|c| *c < u16::MAX)
            .ok_or_else(|| {
                Error::invalid(format!("service {frontend:?}"), "more than 65534 backends")
            })?;
        let old = self.slot(frontend, 0)?;
        let old_count = old.map_or(0, |s| s.count);

        self.put_rev_nat(rev_nat_id, frontend)?;
        for (slot, id) in (1u16..).zip(backend_ids) {
            self.put_slot(
                frontend,
                slot,
                &Lb4Service {
                    backend_id: *id,
                    ..Default::default()
                },
            )?;
        }
        self.put_slot(
            frontend,
            0,
            &Lb4Service {
                // Slot 0's backend_id is the affinity timeout: set_affinity_timeout's.
                backend_id: old.map_or(0, |s| s.backend_id),
                count,
                rev_nat_id,
                flags,
                ..Default::default()
            },
        )?;
        for slot in count + 1..=old_count {
            self.delete_slot(frontend, slot)?;
        }
        Ok(())
    }

    /// Sets the session affinity timeout (seconds, 0 = none) of a frontend written by
    /// [`Services::put_service`]; its backends must be in the affinity match map first.
    pub fn set_affinity_timeout(&self, frontend: &Frontend, seconds: u32) -> Result<()> {
        let Some(mut svc) = self.slot(frontend, 0)? else {
            return Err(Error::invalid(
                format!("service {frontend:?}"),
                "no such frontend for session affinity",
            ));
        };
        if svc.backend_id != seconds {
            svc.backend_id = seconds;
            self.put_slot(frontend, 0, &svc)?;
        }
        Ok(())
    }

    fn put_rev_nat(&self, id: u16, frontend: &Frontend) -> Result<()> {
        let port = frontend.port.to_be();
        match frontend.vip {
            IpAddr::V4(vip) => self.v4.revnat.put(
                &id,
                &Lb4ReverseNat {
                    vip: be32(vip),
                    port,
                    pad: 0,
                },
            ),
            IpAddr::V6(vip) => self.v6.revnat.put(
                &id,
                &Lb6ReverseNat {
                    vip: vip.octets(),
                    port,
                    pad: 0,
                },
            ),
        }
    }

    /// The service of a frontend.
    pub fn service(&self, frontend: &Frontend) -> Result<Option<ServiceEntry>> {
        let Some(svc) = self.slot(frontend, 0)? else {
            return Ok(None);
        };
        let mut backend_ids = Vec::with_capacity(usize::from(svc.count));
        for slot in 1..=svc.count {
            if let Some(s) = self.slot(frontend, slot)? {
                backend_ids.push(s.backend_id);
            }
        }
        Ok(Some(ServiceEntry {
            rev_nat_id: svc.rev_nat_id,
            backend_ids,
            affinity_timeout: svc.backend_id,
            flags: svc.flags,
        }))
    }

    /// Every service of both families, from one read of each services map (in batches), not
    /// a lookup per slot.
    pub fn services(&self) -> Result<BTreeMap<Frontend, ServiceEntry>> {
        let mut slots: BTreeMap<Frontend, FrontendSlots> = BTreeMap::new();
        for (k, v) in self.v4.services.entries()? {
            slots
                .entry(Frontend::from_key4(&k))
                .or_default()
                .add(k.slot, v);
        }
        for (k, v) in self.v6.services.entries()? {
            slots
                .entry(Frontend::from_key6(&k))
                .or_default()
                .add(k.slot, v);
        }
        Ok(slots
            .into_iter()
            .filter_map(|(fe, s)| Some((fe, s.entry()?)))
            .collect())
    }

    /// Whether either family's services map holds any frontend: one key read each, where
    /// [`services`](Self::services) reads them whole. A map that cannot be read counts as
    /// holding none, which sends a caller to the path of maps that serve nothing (whose full
    /// read then reports the error).
    pub fn holds_frontends(&self) -> bool {
        self.v4.services.handle().keys().next().is_some()
            || self.v6.services.handle().keys().next().is_some()
    }

    /// Removes a service's slots (slot 0 first, so no new connection picks
    /// a slot being removed). Its reverse NAT entry stays for the
    /// connections still open; remove it with [`Services::delete_rev_nat`].
    pub fn delete_service(&self, frontend: &Frontend) -> Result<bool> {
        let Some(svc) = self.slot(frontend, 0)? else {
            return Ok(false);
        };
        self.delete_slot(frontend, 0)?;
        for slot in 1..=svc.count {
            self.delete_slot(frontend, slot)?;
        }
        Ok(true)
    }

    /// The frontend replies of `rev_nat_id` are translated back to, of either family.
    pub fn rev_nat(&self, rev_nat_id: u16) -> Result<Option<(IpAddr, u16)>> {
        if let Some(r) = self.v4.revnat.get(&rev_nat_id)? {
            return Ok(Some((ipv4_of(r.vip).into(), u16::from_be(r.port))));
        }
        Ok(self
            .v6
            .revnat
            .get(&rev_nat_id)?
            .map(|r| (Ipv6Addr::from(r.vip).into(), u16::from_be(r.port))))
    }

    /// Every reverse NAT entry of both families.
    pub fn rev_nats(&self) -> Result<BTreeMap<u16, (IpAddr, u16)>> {
        let mut out: BTreeMap<u16, (IpAddr, u16)> = self
            .v4
            .revnat
            .entries()?
            .into_iter()
            .map(|(id, r)| (id, (ipv4_of(r.vip).into(), u16::from_be(r.port))))
            .collect();
        out.extend(
            self.v6
                .revnat
                .entries()?
                .into_iter()
                .map(|(id, r)| (id, (Ipv6Addr::from(r.vip).into(), u16::from_be(r.port)))),
        );
        Ok(out)
    }

    /// Removes a reverse NAT entry (of either family).
    pub fn delete_rev_nat(&self, rev_nat_id: u16) -> Result<bool> {
        let v4 = self.v4.revnat.delete(&rev_nat_id)?;
        let v6 = self.v6.revnat.delete(&rev_nat_id)?;
        Ok(v4 || v6)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn frontend_keys_round_trip() {
        let fe = Frontend {
            vip: Ipv4Addr::new(10, 96, 0, 10).into(),
            port: 8080,
            protocol: Protocol::Tcp,
        };
        let Key::V4(k) = fe.key(3) else {
            panic!("not an IPv4 key")
        };
        assert_eq!(k.slot, 3);
        assert_eq!(k.dport, 8080u16.to_be());
        assert_eq!(Frontend::from_key4(&k), fe);
        let fe6 = Frontend {
            vip: "fd00:96::10".parse().unwrap(),
            ..fe
        };
        let Key::V6(k) = fe6.key(0) else {
            panic!("not an IPv6 key")
        };
        assert_eq!(Frontend::from_key6(&k), fe6);
    }
}
