//! The services benchmark's services, written twice: as the `v1 Service` and
//! `EndpointSlice` objects Cellium programs, and as the iptables `nat` table kube-proxy's
//! iptables mode writes for the same services. Service `i` has cluster IP
//! [`service_vip`]`(i)`, one TCP port, and one backend.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::ops::Range;

/// The cluster IP of service `i`: 10.96.0.1 and on, inside the default `service-cidr`.
pub fn service_vip(i: u32) -> IpAddr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 1)) + i).into()
}

/// Services `range` and one EndpointSlice each, naming `backend`, in namespace `bench` (the
/// first document), as multi-document YAML for `Resources::apply`.
pub fn cellium_objects(range: Range<u32>, port: u16, backend: SocketAddrV4) -> String {
    let mut yaml = String::from("apiVersion: v1\nkind: Namespace\nmetadata: {name: bench}\n");
    for i in range {
        let vip = service_vip(i);
        let _ = write!(
            yaml,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\n\
             spec: {{clusterIP: {vip}, ports: [{{port: {port}, targetPort: {tp}, protocol: TCP}}]}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{name: svc-{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: svc-{i}}}}}\n\
             addressType: IPv4\nendpoints: [{{addresses: [\"{ip}\"]}}]\nports: [{{port: {tp}, protocol: TCP}}]\n",
            tp = backend.port(),
            ip = backend.ip(),
        );
    }
    yaml
}

/// kube-proxy's iptables mode for services `0..count`, as `iptables-restore` input for the
/// `nat` table: the service portals from PREROUTING and OUTPUT, one `KUBE-SERVICES` rule per
/// service (matched in order, so a new connection walks the chain), a `KUBE-SVC-*` chain
/// marking traffic from outside `cluster_cidr` for masquerade, a `KUBE-SEP-*` chain marking
/// hairpin traffic and translating to the backend, the masquerade in `KUBE-POSTROUTING`, and
/// the node-port rule last, as kube-proxy lays them out. Its `filter` table rules do not act
/// on a ClusterIP connection that has a backend and are left out.
pub fn kube_proxy_rules(
    count: u32,
    port: u16,
    backend: SocketAddrV4,
    cluster_cidr: &str,
) -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    for i in 0..count {
        let (svc, sep) = (chain("SVC", i), chain("SEP", i));
        let vip = service_vip(i);
        let name = format!("bench/svc-{i}");
        let _ = writeln!(chains, ":{svc} - [0:0]\n:{sep} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {vip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport {port} -j {svc}\n\
             -A {svc} ! -s {cluster_cidr} -d {vip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport {port} -j KUBE-MARK-MASQ\n\
             -A {svc} -m comment --comment \"{name} -> {backend}\" -j {sep}\n\
             -A {sep} -s {ip}/32 -m comment --comment \"{name}\" -j KUBE-MARK-MASQ\n\
             -A {sep} -p tcp -m comment --comment \"{name}\" -m tcp -j DNAT --to-destination {backend}",
            ip = backend.ip(),
        );
    }
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
         :KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-NODEPORTS - [0:0]\n\
         {chains}\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         {rules}\
         -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
         COMMIT\n"
    )
}

/// `KUBE-SVC-…`/`KUBE-SEP-…` names of service `i`: kube-proxy hashes the service's name into
/// 16 characters; any distinct 16 do for the kernel.
fn chain(kind: &str, i: u32) -> String {
    let h = u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("KUBE-{kind}-{h:016X}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_service_gets_its_own_address_objects_and_chains() {
        let backend = SocketAddrV4::new(Ipv4Addr::new(10, 244, 0, 12), 8080);
        assert_eq!(service_vip(0).to_string(), "10.96.0.1");
        assert_eq!(service_vip(255).to_string(), "10.96.1.0");
        let yaml = cellium_objects(0..3, 80, backend);
        assert_eq!(yaml.matches("kind: Service\n").count(), 3);
        assert_eq!(yaml.matches("kind: EndpointSlice\n").count(), 3);
        assert!(yaml.contains("clusterIP: 10.96.0.3"));
        let rules = kube_proxy_rules(3, 80, backend, "10.244.0.0/16");
        assert_eq!(rules.matches("-A KUBE-SERVICES -d ").count(), 3);
        assert_eq!(
            rules
                .matches("DNAT --to-destination 10.244.0.12:8080")
                .count(),
            3
        );
        let names: std::collections::BTreeSet<_> = (0..1000).map(|i| chain("SVC", i)).collect();
        assert_eq!(names.len(), 1000);
        assert!(
            names.iter().all(|n| n.len() <= 28),
            "iptables chain names are at most 28"
        );
    }
}
