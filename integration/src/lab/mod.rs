//! A policy lab: a real agent in its node namespace, pods in Kubernetes namespaces created
//! through `cellium-cni` exactly as a kubelet would (`K8S_POD_NAMESPACE`/`K8S_POD_NAME`, their
//! labels and named ports applied first with `cellium apply`), an external network routed
//! through the node ([`External`]), servers on every probed port of every place, and truth
//! tables probed with real TCP, UDP and ICMP ([`table`]).
//!
//! ```no_run
//! use cellium_integration::lab::Lab;
//! use cellium_integration::reach::Probe;
//!
//! let mut lab = Lab::start(Default::default()).unwrap();
//! lab.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\
//!            apiVersion: v1\nkind: Pod\nmetadata: {name: db, namespace: shop, labels: {app: db}}\n\
//!            spec: {containers: [{name: c}]}\n").unwrap();
//! lab.add_pod("shop/db", "10.244.0.11".parse().unwrap()).unwrap();
//! lab.apply_policy("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n\
//!                   metadata: {name: deny, namespace: shop}\nspec: {podSelector: {}}\n").unwrap();
//! lab.check("default deny", &[Probe::Tcp(80), Probe::Icmp], |f| {
//!     !f.to.is("shop/db") || f.from.is_node()
//! });
//! ```
//!
//! Changes of policy are followed with [`Lab::apply_policy`] / [`Lab::delete_policy`], which
//! return once the repository took the change in and every endpoint reports that it enforces
//! the resulting revision ([`Lab::settle`]): what the API says, not a sleep.
//!
//! Dropping the lab stops the servers, removes the pods' namespaces, the external network
//! and the agent with its node namespace.

pub mod external;
pub mod fixture;
pub mod hammer;
pub mod open;
pub mod service_bed;
pub mod table;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use external::External;
pub use hammer::{Hammer, HammerLog, Stream, StreamLog};
pub use open::OpenFlow;
pub use table::{Family, Flow, Place, PlaceKind, Row, Table};

use crate::agent::{Agent, AgentOptions};
use crate::cni::CniCall;
use crate::error::{Error, Result};
use crate::netns::NetNs;
use crate::probe::{TcpServer, UdpServer};
use crate::reach::Probe;

/// How long a policy change may take to be enforced everywhere before it is an error.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A pod of the lab.
#[derive(Debug)]
pub struct LabPod {
    /// `namespace/name`.
    pub key: String,
    /// The runtime's container id.
    pub container_id: String,
    /// Its network namespace.
    pub netns: NetNs,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its IPv6 address, in a dual-stack lab.
    pub ip6: Option<Ipv6Addr>,
}

/// A server of the lab: it serves until it is dropped, which is all it is held for.
#[derive(Debug)]
enum Server {
    Tcp(#[allow(dead_code)] TcpServer),
    Udp(#[allow(dead_code)] UdpServer),
}

/// The lab; see the module docs.
#[derive(Debug)]
pub struct Lab {
    // Fields drop in order: servers first, then pods and the external network, then the agent.
    servers: BTreeMap<(String, IpAddr, Probe), Server>,
    pods: Vec<LabPod>,
    external: External,
    agent: Agent,
    pod_cidrs: Vec<String>,
    files: tempfile::TempDir,
    written: usize,
    /// Pods created so far: container ids are never reused, even after a pod is removed.
    created: usize,
}

impl Lab {
    /// Starts an agent with `opts` and attaches the external network to its node.
    pub fn start(opts: AgentOptions) -> Result<Lab> {
        let pod_cidrs = opts.pod_cidrs.clone();
        let agent = Agent::start_new(opts)?;
        let external = External::attach(agent.node(), &pod_cidrs)?;
        let files = crate::temp_dir("cel-lab-")?;
        Ok(Lab {
            servers: BTreeMap::new(),
            pods: Vec::new(),
            external,
            agent,
            pod_cidrs,
            files,
            written: 0,
            created: 0,
        })
    }

    /// The agent.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The agent, to stop, kill or start it.
    pub fn agent_mut(&mut self) -> &mut Agent {
        &mut self.agent
    }

    /// The pod CIDRs the agent was started with.
    pub fn pod_cidrs(&self) -> &[String] {
        &self.pod_cidrs
    }

    /// The pod `namespace/name`.
    pub fn pod(&self, key: &str) -> Option<&LabPod> {
        self.pods.iter().find(|p| p.key == key)
    }

    /// The external network.
    pub fn external(&self) -> &External {
        &self.external
    }

    /// Writes `yaml` to a file of the lab's own and returns its path.
    pub fn write(&mut self, yaml: &str) -> Result<PathBuf> {
        self.written += 1;
        let path = self.files.path().join(format!("{:03}.yaml", self.written));
        std::fs::write(&path, yaml).map_err(|source| Error::Io {
            op: "write",
            path: path.display().to_string(),
            source,
        })?;
        Ok(path)
    }

    /// `cellium apply -f` of `yaml`.
    pub fn apply(&mut self, yaml: &str) -> Result<()> {
        let path = self.write(yaml)?;
        self.agent
            .cli(&["apply", "-f", &path.display().to_string()])
            .map(|_| ())
    }

    /// `cellium delete -f` of `yaml`.
    pub fn delete(&mut self, yaml: &str) -> Result<()> {
        let path = self.write(yaml)?;
        self.agent
            .cli(&["delete", "-f", &path.display().to_string()])
            .map(|_| ())
    }

    /// Applies policies and waits until every endpoint enforces them.
    pub fn apply_policy(&mut self, yaml: &str) -> Result<u64> {
        let before = self.revision()?;
        self.apply(yaml)?;
        self.wait_revision_after(before)?;
        self.settle()
    }

    /// Deletes policies and waits until every endpoint enforces what remains.
    pub fn delete_policy(&mut self, yaml: &str) -> Result<u64> {
        let before = self.revision()?;
        self.delete(yaml)?;
        self.wait_revision_after(before)?;
        self.settle()
    }

    /// The IPv6 twin of a pod address in a dual-stack lab: the IPv6 pod CIDR's network with the
    /// IPv4 address's last byte (`10.244.0.10` is `fd00:10:244::a` in `fd00:10:244::/112`),
    /// so that fixed IPv6 addresses, and ipBlocks naming them, mirror the IPv4 ones.
    pub fn ip6_of(&self, ip: Ipv4Addr) -> Option<Ipv6Addr> {
        let base = self.pod_cidrs.iter().find_map(|c| {
            match c
                .parse::<cellium_datapath_bpf::IpNet>()
                .ok()?
                .trunc()
                .addr()
            {
                IpAddr::V6(network) => Some(u128::from(network)),
                IpAddr::V4(_) => None,
            }
        })?;
        Some(Ipv6Addr::from(base | u128::from(ip.octets()[3])))
    }

    /// Creates the pod `namespace/name` (its object must be applied) with address `ip` (and its
    /// IPv6 twin, [`Lab::ip6_of`], in a dual-stack lab) through the CNI plugin, as a kubelet
    /// would.
    pub fn add_pod(&mut self, key: &str, ip: Ipv4Addr) -> Result<&LabPod> {
        let (ns, name) = key.split_once('/').ok_or_else(|| Error::Unexpected {
            what: "pod key",
            detail: format!("{key:?} is not namespace/name"),
        })?;
        let netns = NetNs::new()?;
        self.created += 1;
        let container_id = format!("lab{}x{}", self.created, std::process::id());
        let ip6 = self.ip6_of(ip);
        let ips = match ip6 {
            Some(v6) => format!("{ip},{v6}"),
            None => ip.to_string(),
        };
        let call = CniCall::new("ADD", &container_id)
            .netns(netns.path())
            .args(&format!(
                "K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};IP={ips}"
            ));
        let (status, out) = self.agent.cni(&call)?;
        if !status.success() {
            return Err(Error::Unexpected {
                what: "CNI ADD failure",
                detail: format!("{key} ({status}): {out}"),
            });
        }
        self.pods.push(LabPod {
            key: key.to_string(),
            container_id,
            netns,
            ip,
            ip6,
        });
        Ok(&self.pods[self.pods.len() - 1])
    }

    /// Deletes the pod `namespace/name` through the CNI plugin, as a kubelet would, and
    /// removes its network namespace (its Kubernetes object stays until deleted).
    pub fn remove_pod(&mut self, key: &str) -> Result<()> {
        let pod = self.take_pod(key)?;
        self.agent.del(&pod.container_id, &pod.netns.path())
    }

    /// Makes the pod `namespace/name` vanish without a DEL, as a runtime that lost it would:
    /// its servers stop and its network namespace is removed, so the kernel destroys the
    /// namespace and the veth pair into it (its endpoint's host end is gone once it has).
    pub fn vanish_pod(&mut self, key: &str) -> Result<()> {
        drop(self.take_pod(key)?);
        Ok(())
    }

    /// Takes the pod `namespace/name` out of the lab, its servers stopped; the caller has its
    /// network namespace.
    fn take_pod(&mut self, key: &str) -> Result<LabPod> {
        let i = self
            .pods
            .iter()
            .position(|p| p.key == key)
            .ok_or_else(|| Error::Unexpected {
                what: "pod",
                detail: format!("no pod {key} in the lab"),
            })?;
        self.servers.retain(|(place, ..), _| place != key);
        Ok(self.pods.remove(i))
    }

    /// Every place: the pods, the node (at its pods' gateway address), the external addresses.
    pub fn places(&self) -> Result<Vec<Place>> {
        let mut out: Vec<Place> = self
            .pods
            .iter()
            .map(|p| Place {
                name: p.key.clone(),
                kind: PlaceKind::Pod,
                netns: p.netns.name().to_string(),
                ip: p.ip,
                ip6: p.ip6,
            })
            .collect();
        let (router, router6) = self.routers()?;
        out.push(Place {
            name: "node".into(),
            kind: PlaceKind::Node,
            netns: self.agent.node().name().to_string(),
            ip: router,
            ip6: router6,
        });
        let ext6 = self.external.addrs6();
        for (i, (name, ip)) in external::EXT_ADDRS.into_iter().enumerate() {
            out.push(Place {
                name: name.into(),
                kind: PlaceKind::External,
                netns: self.external.netns().name().to_string(),
                ip,
                ip6: ext6.map(|a| a[i]),
            });
        }
        Ok(out)
    }

    /// The place named `name`.
    pub fn place(&self, name: &str) -> Result<Place> {
        self.places()?
            .into_iter()
            .find(|p| p.name == name)
            .ok_or_else(|| Error::Unexpected {
                what: "place",
                detail: format!("no place named {name}"),
            })
    }

    /// The pods' gateway: the node's address on `cellium_host`.
    pub fn router(&self) -> Result<Ipv4Addr> {
        self.routers().map(|(v4, _)| v4)
    }

    /// The pods' IPv4 gateway and, in a dual-stack lab, their IPv6 one.
    fn routers(&self) -> Result<(Ipv4Addr, Option<Ipv6Addr>)> {
        let routers: Vec<IpAddr> = self
            .agent
            .pools()?
            .iter()
            .filter_map(|p| p["router"].as_str()?.parse().ok())
            .collect();
        let v4 = routers.iter().find_map(|ip| match ip {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        });
        let v6 = routers.iter().find_map(|ip| match ip {
            IpAddr::V6(v6) => Some(*v6),
            IpAddr::V4(_) => None,
        });
        let v4 = v4.ok_or_else(|| Error::Unexpected {
            what: "ipam list",
            detail: "no IPv4 pool with a router address".into(),
        })?;
        Ok((v4, v6))
    }

    /// Starts, on every place, a server for each TCP and UDP probe not served yet, listening
    /// on each of the place's addresses (an external address too: a UDP answer must come from
    /// the address asked, which a server on the wildcard address would not ensure).
    pub fn serve(&mut self, probes: &[Probe]) -> Result<()> {
        for place in self.places()? {
            let ns = NetNs::existing(&place.netns);
            for ip in Family::ALL.iter().filter_map(|f| place.addr(*f)) {
                for &probe in probes {
                    let key = (place.name.clone(), ip, probe);
                    if self.servers.contains_key(&key) {
                        continue;
                    }
                    let server = match probe {
                        Probe::Tcp(port) => Server::Tcp(TcpServer::start(
                            &ns,
                            SocketAddr::new(ip, port),
                            &place.name,
                        )?),
                        Probe::Udp(port) => Server::Udp(UdpServer::start(
                            &ns,
                            SocketAddr::new(ip, port),
                            &place.name,
                        )?),
                        Probe::Icmp => continue,
                    };
                    self.servers.insert(key, server);
                }
            }
        }
        Ok(())
    }

    /// Probes every flow of the lab's places for `probes` (serving them first) against the
    /// expectation.
    pub fn table(
        &mut self,
        scenario: &str,
        probes: &[Probe],
        expect: impl Fn(&Flow<'_>) -> bool,
    ) -> Result<Table> {
        self.serve(probes)?;
        let places = self.places()?;
        Ok(table::run(scenario, &places, probes, expect))
    }

    /// [`Lab::table`], then panics with the whole table and every difference unless every
    /// flow behaved as expected.
    #[track_caller]
    pub fn check(&mut self, scenario: &str, probes: &[Probe], expect: impl Fn(&Flow<'_>) -> bool) {
        match self.table(scenario, probes, expect) {
            Ok(t) => t.assert(),
            Err(e) => panic!("truth table \"{scenario}\" could not be probed: {e}"),
        }
    }

    /// Opens a flow from place `from` to place `to` for `probe` (TCP or UDP) over IPv4, serving
    /// it first.
    pub fn open(&mut self, from: &str, to: &str, probe: Probe) -> Result<OpenFlow> {
        self.open_in(Family::Ipv4, from, to, probe)
    }

    /// [`Lab::open`] in `family`.
    pub fn open_in(
        &mut self,
        family: Family,
        from: &str,
        to: &str,
        probe: Probe,
    ) -> Result<OpenFlow> {
        self.serve(&[probe])?;
        let (from, to) = (self.place(from)?, self.place(to)?);
        let ns = NetNs::existing(&from.netns);
        let dst = to.addr(family).ok_or_else(|| Error::Unexpected {
            what: "open flow",
            detail: format!("{} has no {family} address", to.name),
        })?;
        match probe {
            Probe::Tcp(port) => OpenFlow::tcp(&ns, SocketAddr::new(dst, port)),
            Probe::Udp(port) => OpenFlow::udp(&ns, SocketAddr::new(dst, port)),
            Probe::Icmp => Err(Error::Unexpected {
                what: "open flow",
                detail: "ICMP echoes are not kept open".into(),
            }),
        }
    }

    /// Starts hammering the flow from place `from` to place `to` with `probe` over IPv4
    /// (serving it first, so that any attempt let through is answered).
    pub fn hammer(&mut self, from: &str, to: &str, probe: Probe) -> Result<Hammer> {
        self.hammer_in(Family::Ipv4, from, to, probe)
    }

    /// [`Lab::hammer`] in `family`.
    pub fn hammer_in(
        &mut self,
        family: Family,
        from: &str,
        to: &str,
        probe: Probe,
    ) -> Result<Hammer> {
        self.serve(&[probe])?;
        let (from, to) = (self.place(from)?, self.place(to)?);
        let missing = |p: &Place| Error::Unexpected {
            what: "hammer",
            detail: format!("{} has no {family} address", p.name),
        };
        let dst = to.addr(family).ok_or_else(|| missing(&to))?;
        let src = match from.is_external() {
            true => Some(from.addr(family).ok_or_else(|| missing(&from))?),
            false => None,
        };
        let what = match family {
            Family::Ipv4 => format!("{} -> {} {probe}", from.name, to.name),
            Family::Ipv6 => format!("{} -> {} {probe} (IPv6)", from.name, to.name),
        };
        Ok(Hammer::start(
            what,
            &NetNs::existing(&from.netns),
            src,
            dst,
            probe,
        ))
    }

    /// Polls `check` every 50 ms until it holds; fails naming `what` after 30 s.
    pub fn wait_until(
        &self,
        what: &str,
        mut check: impl FnMut(&Lab) -> Result<bool>,
    ) -> Result<()> {
        let began = Instant::now();
        while !check(self)? {
            if began.elapsed() > SETTLE_TIMEOUT {
                return Err(Error::Unexpected {
                    what: "wait",
                    detail: format!("{what}: not within {SETTLE_TIMEOUT:?}"),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The policy repository's revision.
    pub fn revision(&self) -> Result<u64> {
        self.agent.policy_revision()
    }

    /// Waits until the repository's revision is past `before`: it has taken a change in.
    pub fn wait_revision_after(&self, before: u64) -> Result<u64> {
        self.agent.wait_policy_revision_after(before)
    }

    /// Waits until every endpoint is ready and enforces the repository's current revision.
    pub fn settle(&self) -> Result<u64> {
        self.agent.settle()
    }

    /// Each pod's endpoint as `cellium endpoint list -o json` shows it, by `namespace/name`.
    pub fn endpoints(&self) -> Result<BTreeMap<String, Value>> {
        Ok(self
            .agent
            .endpoints()?
            .into_iter()
            .map(|e| (e["pod"].as_str().unwrap_or_default().to_string(), e))
            .collect())
    }

    /// Each pod's identity, by `namespace/name`.
    pub fn identities(&self) -> Result<BTreeMap<String, u64>> {
        Ok(self
            .endpoints()?
            .into_iter()
            .map(|(k, e)| (k, e["identity"].as_u64().unwrap_or(0)))
            .collect())
    }
}
