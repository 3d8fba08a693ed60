//! The ADD result: one version-independent model, read from and written to every supported
//! version's JSON shape.
//!
//! The model ([`CniResult`]) holds what the 1.x result holds; 0.3.x/0.4.0 differ only on the
//! wire (a `version` per IP, no `mtu`/`socketPath`/`pciID` on interfaces), so conversion is done
//! when reading ([`CniResult::parse`]) and writing ([`CniResult::render`]), in [`wire`].
//! [`merge`] appends this plugin's part to a `prevResult`; [`endpoint`] builds that part from
//! the agent's answer.

pub mod endpoint;
pub mod merge;
pub mod wire;

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::addr::Cidr;

/// An ADD result, independent of the version it is read or written in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    /// Interfaces created, host side included.
    pub interfaces: Vec<Interface>,
    /// Addresses assigned.
    pub ips: Vec<IpConfig>,
    /// Routes created.
    pub routes: Vec<Route>,
    /// Resolver configuration.
    pub dns: Dns,
}

/// An interface of a result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    /// Its name.
    pub name: String,
    /// Its hardware address.
    pub mac: Option<String>,
    /// Its MTU (1.x only on the wire).
    pub mtu: Option<u32>,
    /// The netns path for interfaces inside the container; `None` on the host.
    pub sandbox: Option<String>,
    /// A socket for the interface (1.x only on the wire).
    pub socket_path: Option<String>,
    /// The PCI id of the device (1.x only on the wire).
    pub pci_id: Option<String>,
}

/// An address of a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The address with its prefix.
    pub address: Cidr,
    /// The subnet's gateway.
    pub gateway: Option<IpAddr>,
    /// Index into the result's `interfaces`.
    pub interface: Option<usize>,
}

/// A route of a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The destination.
    pub dst: Cidr,
    /// The next hop.
    pub gw: Option<IpAddr>,
    /// Path MTU.
    pub mtu: Option<u32>,
    /// Advertised MSS.
    pub advmss: Option<u32>,
    /// Route priority (metric).
    pub priority: Option<u32>,
    /// Routing table.
    pub table: Option<u32>,
    /// Route scope.
    pub scope: Option<u32>,
}

/// Resolver configuration, as in the network configuration's `dns` and the result's `dns`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// The local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.as_deref().is_none_or(str::is_empty)
            && self.search.is_empty()
            && self.options.is_empty()
    }
}
