//! `cel_endpoints`: local pods by address.
//!
//! Trap: the datapath trusts this map for anti-spoofing (a pod may only send
//! from an address whose entry names its own host veth), so write the entry
//! with the right `ifindex` before attaching, or the pod's traffic drops
//! with `InvalidSource`.

use std::net::IpAddr;

use crate::abi::{EndpointInfo, EndpointKey};
use crate::error::Result;
use crate::maps::TypedMap;

/// The map name.
pub const NAME: &str = "cel_endpoints";

/// Local endpoints keyed by their address.
#[derive(Debug)]
pub struct Endpoints {
    map: TypedMap<EndpointKey, EndpointInfo>,
}

impl Endpoints {
    pub(crate) fn new(map: TypedMap<EndpointKey, EndpointInfo>) -> Self {
        Self { map }
    }

    /// Adds or replaces the endpoint owning `addr`.
    pub fn put(&self, addr: IpAddr, info: &EndpointInfo) -> Result<()> {
        self.map.put(&EndpointKey::new(addr), info)
    }

    /// The endpoint owning `addr`.
    pub fn get(&self, addr: IpAddr) -> Result<Option<EndpointInfo>> {
        self.map.get(&EndpointKey::new(addr))
    }

    /// Removes `addr`; returns whether it was present.
    pub fn delete(&self, addr: IpAddr) -> Result<bool> {
        self.map.delete(&EndpointKey::new(addr))
    }

    /// Every endpoint address with its entry (keys of unknown family skipped).
    pub fn entries(&self) -> Result<Vec<(IpAddr, EndpointInfo)>> {
        Ok(self
            .map
            .entries()?
            .into_iter()
            .filter_map(|(k, v)| k.ip().map(|ip| (ip, v)))
            .collect())
    }
}
