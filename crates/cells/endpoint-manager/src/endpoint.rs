//! The endpoint record: everything needed to serve, check, restore and remove a pod's endpoint.

use std::net::IpAddr;
use std::path::PathBuf;

use cellium_labels::Labels;
use cellium_resources::HostPort;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Where an endpoint is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Being created: its addresses are taken and its interfaces may exist. A record found in
    /// this state at start belongs to a create that never finished and is removed.
    Creating,
    /// Set up and enforced by the datapath.
    Ready,
    /// Being deleted: recorded before the kernel is touched, and the record removed last, so
    /// that a DEL that failed half-way (or was cut short by a crash) is finished by the next
    /// DEL or by the restore. Its addresses stay taken until then.
    Deleting,
}

impl State {
    /// The state's name as records and messages spell it.
    pub fn name(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Ready => "ready",
            State::Deleting => "deleting",
        }
    }
}

/// A pod's address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Address {
    /// The address.
    pub ip: IpAddr,
    /// The pool it came from.
    pub pool: IpNet,
    /// The pool's router: the pod's gateway.
    pub gateway: IpAddr,
}

/// The pod an endpoint belongs to, when the runtime named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

/// One pod interface managed by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// The endpoint id (the datapath's key for its policy).
    pub id: u16,
    /// The runtime's container id.
    pub container_id: String,
    /// The interface name inside the pod.
    pub ifname: String,
    /// The pod's network namespace.
    pub netns: PathBuf,
    /// The CNI network it was created for.
    pub network: String,
    /// The pod, if named.
    pub pod: Option<PodRef>,
    /// Its addresses.
    pub addresses: Vec<Address>,
    /// The host end of its veth pair.
    pub host_ifname: String,
    /// The host end's interface index (0 until created).
    pub host_ifindex: u32,
    /// The host end's MAC.
    pub host_mac: [u8; 6],
    /// The pod end's MAC.
    pub pod_mac: [u8; 6],
    /// The MTU.
    pub mtu: u32,
    /// Its security-relevant labels: the pod's, its namespace's, and the `cidr:` labels of
    /// the NetworkPolicy ipBlocks that cover its addresses.
    pub labels: Labels,
    /// Its security identity, derived from the labels (0 until assigned).
    pub identity: u32,
    /// The identity other nodes know it by (0 until assigned): that of its labels without
    /// their `cidr:` labels. The same as `identity` unless a policy's ipBlock covers an address
    /// of it: `identity` is node-local then, a number that means nothing elsewhere, so what
    /// it publishes (its CiliumEndpoint, its kvstore entry, the VNI it sends with) carries this
    /// one, and each node derives its own local identity for the address from it.
    #[serde(default)]
    pub cluster_identity: u32,
    /// The ports the runtime asked to publish on the node (the CNI `portMappings`
    /// capability), kept with the record so that they are served again after a restart; svc-lb
    /// serves them as host ports. Absent from records written before they existed: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_mappings: Vec<HostPort>,
    /// Where it is in its life.
    pub state: State,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: i64,
}

impl Endpoint {
    /// How messages name it: `endpoint 12 (shop/web)` or `endpoint 12 (container 3f2a9c1b)`.
    pub fn describe(&self) -> String {
        match &self.pod {
            Some(p) => format!("endpoint {} ({}/{})", self.id, p.namespace, p.name),
            None => format!(
                "endpoint {} (container {})",
                self.id,
                short(&self.container_id)
            ),
        }
    }

    /// The key the runtime knows it by.
    pub fn key(&self) -> (String, String) {
        (self.container_id.clone(), self.ifname.clone())
    }
}

/// The first 12 characters of a container id, as runtimes show them.
pub fn short(container_id: &str) -> &str {
    container_id
        .get(..12.min(container_id.len()))
        .unwrap_or(container_id)
}

/// A MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_resources::Protocol;

    #[test]
    fn port_mappings_are_kept_in_the_record_and_older_records_have_none() {
        let mut ep = crate::testing::endpoint(7, "c1");
        ep.port_mappings = vec![HostPort {
            host_ip: Some("192.168.1.10".parse().unwrap()),
            host_port: 8080,
            container_port: 80,
            protocol: Protocol::Udp,
        }];
        let text = serde_json::to_string(&ep).unwrap();
        assert!(
            text.contains(r#""port_mappings":[{"host_ip":"192.168.1.10","host_port":8080,"container_port":80,"protocol":"UDP"}]"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Endpoint>(&text).unwrap(), ep);
        // A record of an agent that did not know mappings.
        let mut old: serde_json::Value = serde_json::from_str(&text).unwrap();
        old.as_object_mut().unwrap().remove("port_mappings");
        let read: Endpoint = serde_json::from_value(old).unwrap();
        assert!(read.port_mappings.is_empty());
        ep.port_mappings.clear();
        assert!(
            !serde_json::to_string(&ep)
                .unwrap()
                .contains("port_mappings")
        );
    }
}
