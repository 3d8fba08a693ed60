//! ClusterIP maps: `cel_lb4_services` (frontend slots), `cel_lb4_backends`
//! and `cel_lb4_revnat`.
//!
//! Trap: a service's slots reference backend ids, so write backends first,
//! and keep a rev-NAT entry until the service's connections are gone
//! (deleting it makes replies arrive from the backend's own address).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::abi::{Lb4Backend, Lb4Key, Lb4ReverseNat, Lb4Service, be32, ipv4_of};
use crate::error::{Error, Result};
use crate::maps::TypedMap;
use crate::types::Protocol;

/// The services map name.
pub const SERVICES: &str = "cel_lb4_services";
/// The backends map name.
pub const BACKENDS: &str = "cel_lb4_backends";
/// The reverse NAT map name.
pub const REVNAT: &str = "cel_lb4_revnat";

/// A service frontend: what clients connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frontend {
    /// The virtual IP.
    pub vip: Ipv4Addr,
    /// The port (host order).
    pub port: u16,
    /// TCP or UDP.
    pub protocol: Protocol,
}

/// A backend address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Backend {
    /// The backend's address.
    pub addr: Ipv4Addr,
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
}

impl Frontend {
    fn key(&self, slot: u16) -> Lb4Key {
        Lb4Key {
            vip: be32(self.vip),
            dport: self.port.to_be(),
            slot,
            protocol: self.protocol.number(),
            pad: [0; 3],
        }
    }

    fn from_key(k: &Lb4Key) -> Self {
        Self {
            vip: ipv4_of(k.vip),
            port: u16::from_be(k.dport),
            protocol: Protocol::from(k.protocol),
        }
    }
}

/// The three load-balancing maps.
#[derive(Debug)]
pub struct Services {
    services: TypedMap<Lb4Key, Lb4Service>,
    backends: TypedMap<u32, Lb4Backend>,
    revnat: TypedMap<u16, Lb4ReverseNat>,
}

impl Services {
    pub(crate) fn new(
        services: TypedMap<Lb4Key, Lb4Service>,
        backends: TypedMap<u32, Lb4Backend>,
        revnat: TypedMap<u16, Lb4ReverseNat>,
    ) -> Self {
        Self {
            services,
            backends,
            revnat,
        }
    }

    /// Adds or replaces backend `id`.
    pub fn put_backend(&self, id: u32, backend: &Backend) -> Result<()> {
        let value = Lb4Backend {
            addr: be32(backend.addr),
            port: backend.port.to_be(),
            protocol: backend.protocol.number(),
            flags: 0,
        };
        self.backends.put(&id, &value)
    }

    /// Backend `id`.
    pub fn backend(&self, id: u32) -> Result<Option<Backend>> {
        Ok(self.backends.get(&id)?.map(|b| Backend {
            addr: ipv4_of(b.addr),
            port: u16::from_be(b.port),
            protocol: Protocol::from(b.protocol),
        }))
    }

    /// Removes backend `id`; connections pinned to it choose again.
    pub fn delete_backend(&self, id: u32) -> Result<bool> {
        self.backends.delete(&id)
    }

    /// Every backend.
    pub fn backends(&self) -> Result<BTreeMap<u32, Backend>> {
        Ok(self
            .backends
            .entries()?
            .into_iter()
            .map(|(id, b)| {
                (
                    id,
                    Backend {
                        addr: ipv4_of(b.addr),
                        port: u16::from_be(b.port),
                        protocol: Protocol::from(b.protocol),
                    },
                )
            })
            .collect())
    }

    /// Adds or replaces a service: its reverse NAT entry, then the backend
    /// slots, then slot 0 with the count, then slots past the new count are
    /// removed, so the datapath never picks a slot that does not exist.
    pub fn put_service(
        &self,
        frontend: &Frontend,
        rev_nat_id: u16,
        backend_ids: &[u32],
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
        let old_count = self.services.get(&frontend.key(0))?.map_or(0, |s| s.count);

        self.revnat.put(
            &rev_nat_id,
            &Lb4ReverseNat {
                vip: be32(frontend.vip),
                port: frontend.port.to_be(),
                pad: 0,
            },
        )?;
        for (slot, id) in (1u16..).zip(backend_ids) {
            self.services.put(
                &frontend.key(slot),
                &Lb4Service {
                    backend_id: *id,
                    ..Default::default()
                },
            )?;
        }
        self.services.put(
            &frontend.key(0),
            &Lb4Service {
                count,
                rev_nat_id,
                ..Default::default()
            },
        )?;
        for slot in count + 1..=old_count {
            self.services.delete(&frontend.key(slot))?;
        }
        Ok(())
    }

    /// The service of a frontend.
    pub fn service(&self, frontend: &Frontend) -> Result<Option<ServiceEntry>> {
        let Some(svc) = self.services.get(&frontend.key(0))? else {
            return Ok(None);
        };
        let mut backend_ids = Vec::with_capacity(usize::from(svc.count));
        for slot in 1..=svc.count {
            if let Some(s) = self.services.get(&frontend.key(slot))? {
                backend_ids.push(s.backend_id);
            }
        }
        Ok(Some(ServiceEntry {
            rev_nat_id: svc.rev_nat_id,
            backend_ids,
        }))
    }

    /// Every service.
    pub fn services(&self) -> Result<BTreeMap<Frontend, ServiceEntry>> {
        let mut out = BTreeMap::new();
        for (key, _) in self.services.entries()?.iter().filter(|(k, _)| k.slot == 0) {
            let fe = Frontend::from_key(key);
            if let Some(s) = self.service(&fe)? {
                out.insert(fe, s);
            }
        }
        Ok(out)
    }

    /// Removes a service's slots (slot 0 first, so no new connection picks
    /// a slot being removed). Its reverse NAT entry stays for the
    /// connections still open; remove it with [`Services::delete_rev_nat`].
    pub fn delete_service(&self, frontend: &Frontend) -> Result<bool> {
        let Some(svc) = self.services.get(&frontend.key(0))? else {
            return Ok(false);
        };
        self.services.delete(&frontend.key(0))?;
        for slot in 1..=svc.count {
            self.services.delete(&frontend.key(slot))?;
        }
        Ok(true)
    }

    /// The frontend replies of `rev_nat_id` are translated back to.
    pub fn rev_nat(&self, rev_nat_id: u16) -> Result<Option<(Ipv4Addr, u16)>> {
        Ok(self
            .revnat
            .get(&rev_nat_id)?
            .map(|r| (ipv4_of(r.vip), u16::from_be(r.port))))
    }

    /// Removes a reverse NAT entry.
    pub fn delete_rev_nat(&self, rev_nat_id: u16) -> Result<bool> {
        self.revnat.delete(&rev_nat_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontend_keys_round_trip() {
        let fe = Frontend {
            vip: Ipv4Addr::new(10, 96, 0, 10),
            port: 8080,
            protocol: Protocol::Tcp,
        };
        let k = fe.key(3);
        assert_eq!(k.slot, 3);
        assert_eq!(k.dport, 8080u16.to_be());
        assert_eq!(Frontend::from_key(&k), fe);
    }
}
