//! The built `cellium-cni` binary against a scripted gRPC agent on a unix socket.
//!
//! The scripted agent implements the `cellium.v1` services the plugin calls with canned
//! behaviour (no netlink, no IPAM), to pin down the plugin's side of the contract: what it
//! sends, how it prints the agent's answers in every CNI version, how it merges `prevResult`,
//! and which CNI code each gRPC status becomes. End-to-end tests with the real agent, pods in
//! network namespaces and traffic live in `integration/`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use cellium_api::v1::agent_server::{Agent, AgentServer};
use cellium_api::v1::endpoints_server::{Endpoints, EndpointsServer};
use cellium_api::v1::ipam_server::{Ipam, IpamServer};
use cellium_api::v1::{
    CheckEndpointRequest, CheckEndpointResponse, CreateEndpointRequest, DeleteEndpointRequest,
    DeleteEndpointResponse, Endpoint, EndpointState, GcRequest, GcResponse, GetEndpointRequest,
    HealthLevel, HealthNode, IpConfig, IpPool, ListEndpointsRequest, ListEndpointsResponse,
    ListIpamRequest, ListIpamResponse, Route, StatusRequest, StatusResponse,
};
use serde_json::{Value, json};
use tonic::{Request, Response, Status};

/// What the scripted agent answers and what it was asked.
#[derive(Default)]
struct State {
    /// Fail Create with this status instead of creating.
    create_error: Option<Status>,
    /// Fail Check with this status.
    check_error: Option<Status>,
    /// The health level and module tree Status reports.
    health: Option<(HealthLevel, Vec<HealthNode>)>,
    /// The pools Ipam.List reports.
    pools: Vec<IpPool>,
    /// Endpoints that exist.
    endpoints: Vec<Endpoint>,
    /// Requests received.
    creates: Vec<CreateEndpointRequest>,
    deletes: Vec<DeleteEndpointRequest>,
    gcs: Vec<GcRequest>,
}

#[derive(Clone, Default)]
struct Scripted(Arc<Mutex<State>>);

impl Scripted {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[tonic::async_trait]
impl Endpoints for Scripted {
    async fn create(
        &self,
        request: Request<CreateEndpointRequest>,
    ) -> Result<Response<Endpoint>, Status> {
        let req = request.into_inner();
        let mut state = self.state();
        state.creates.push(req.clone());
        if let Some(status) = state.create_error.clone() {
            return Err(status);
        }
        let id = state.endpoints.len() as u32 + 1;
        let address = match req.requested_ips.first() {
            Some(ip) if ip.contains('/') => ip.clone(),
            Some(ip) => format!("{ip}/32"),
            None => format!("10.0.0.{}/32", id + 4),
        };
        let ep = Endpoint {
            id,
            container_id: req.container_id,
            ifname: req.ifname,
            netns: req.netns,
            pod_namespace: req.pod_namespace,
            pod_name: req.pod_name,
            network: req.network,
            addresses: vec![IpConfig {
                address,
                gateway: "10.0.0.1".into(),
            }],
            routes: vec![Route {
                dst: "0.0.0.0/0".into(),
                gateway: "10.0.0.1".into(),
            }],
            host_ifname: format!("lxc{id:04}"),
            host_mac: "02:00:00:00:01:01".into(),
            pod_mac: "02:00:00:00:01:02".into(),
            mtu: if req.mtu == 0 { 1500 } else { req.mtu },
            state: EndpointState::Ready as i32,
            ..Endpoint::default()
        };
        state.endpoints.push(ep.clone());
        Ok(Response::new(ep))
    }

    async fn delete(
        &self,
        request: Request<DeleteEndpointRequest>,
    ) -> Result<Response<DeleteEndpointResponse>, Status> {
        let req = request.into_inner();
        let mut state = self.state();
        state.deletes.push(req.clone());
        let before = state.endpoints.len();
        state
            .endpoints
            .retain(|e| !(e.container_id == req.container_id && e.ifname == req.ifname));
        Ok(Response::new(DeleteEndpointResponse {
            existed: state.endpoints.len() != before,
        }))
    }

    async fn check(
        &self,
        request: Request<CheckEndpointRequest>,
    ) -> Result<Response<CheckEndpointResponse>, Status> {
        let req = request.into_inner();
        let state = self.state();
        if let Some(status) = state.check_error.clone() {
            return Err(status);
        }
        let known = state
            .endpoints
            .iter()
            .any(|e| e.container_id == req.container_id && e.ifname == req.ifname);
        if known {
            Ok(Response::new(CheckEndpointResponse {}))
        } else {
            Err(Status::not_found("no endpoint"))
        }
    }

    async fn get(&self, _: Request<GetEndpointRequest>) -> Result<Response<Endpoint>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn list(
        &self,
        _: Request<ListEndpointsRequest>,
    ) -> Result<Response<ListEndpointsResponse>, Status> {
        Ok(Response::new(ListEndpointsResponse {
            endpoints: self.state().endpoints.clone(),
        }))
    }

    async fn gc(&self, request: Request<GcRequest>) -> Result<Response<GcResponse>, Status> {
        let req = request.into_inner();
        let mut state = self.state();
        state.gcs.push(req.clone());
        let mut removed = Vec::new();
        state.endpoints.retain(|e| {
            let valid = e.network != req.network
                || req
                    .valid
                    .iter()
                    .any(|a| a.container_id == e.container_id && a.ifname == e.ifname);
            if !valid {
                removed.push(e.id);
            }
            valid
        });
        Ok(Response::new(GcResponse { removed }))
    }
}

#[tonic::async_trait]
impl Agent for Scripted {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let (level, modules) = self
            .state()
            .health
            .clone()
            .unwrap_or((HealthLevel::Ok, Vec::new()));
        Ok(Response::new(StatusResponse {
            version: "0.1.0".into(),
            uptime_ms: 1000,
            level: level as i32,
            modules,
        }))
    }
}

#[tonic::async_trait]
impl Ipam for Scripted {
    async fn list(
        &self,
        _: Request<ListIpamRequest>,
    ) -> Result<Response<ListIpamResponse>, Status> {
        Ok(Response::new(ListIpamResponse {
            pools: self.state().pools.clone(),
        }))
    }
}

/// A scripted agent serving on a socket in its own directory until dropped.
struct Served {
    agent: Scripted,
    socket: PathBuf,
    _dir: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
}

fn serve(agent: Scripted) -> Served {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("agent.sock");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = {
        let _guard = runtime.enter();
        tokio::net::UnixListener::bind(&socket).expect("bind")
    };
    let service = agent.clone();
    runtime.spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(EndpointsServer::new(service.clone()))
            .add_service(AgentServer::new(service.clone()))
            .add_service(IpamServer::new(service))
            .serve_with_incoming(incoming)
            .await;
    });
    Served {
        agent,
        socket,
        _dir: dir,
        _runtime: runtime,
    }
}

struct Run {
    status: i32,
    stdout: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", self.stdout))
    }

    fn ok(&self) -> &Self {
        assert_eq!(self.status, 0, "{}", self.stdout);
        self
    }

    fn error(&self, code: u64) -> String {
        assert_ne!(self.status, 0, "{}", self.stdout);
        let err = self.json();
        assert_eq!(err["code"], code, "{err}");
        err["msg"].as_str().unwrap_or_default().to_string()
    }
}

fn run(env: &[(&str, &str)], stdin: &Value) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellium-cni"))
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn cellium-cni");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.to_string().as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    Run {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

fn env(verb: &'static str, container: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("CNI_COMMAND", verb),
        ("CNI_CONTAINERID", container),
        ("CNI_NETNS", "/run/netns/pod-1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
        ),
    ]
}

fn conf(version: &str, socket: &Path) -> Value {
    json!({
        "cniVersion": version,
        "name": "cellium",
        "type": "cellium-cni",
        "socket": socket,
        "timeout": "10s",
        "dns": {"nameservers": ["10.96.0.10"]},
    })
}

#[test]
fn add_sends_the_attachment_and_prints_the_result_in_each_version() {
    let served = serve(Scripted::default());
    for (n, version) in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
        .iter()
        .enumerate()
    {
        let mut c = conf(version, &served.socket);
        c["mtu"] = json!(1400);
        let out = run(&env("ADD", "c1"), &c);
        let result = out.ok().json();
        let legacy = version.starts_with("0.");
        let mut expected = json!({
            "cniVersion": version,
            "interfaces": [
                {"name": format!("lxc{:04}", n + 1), "mac": "02:00:00:00:01:01"},
                {"name": "eth0", "mac": "02:00:00:00:01:02", "sandbox": "/run/netns/pod-1"}
            ],
            "ips": [{"interface": 1, "address": format!("10.0.0.{}/32", n + 5), "gateway": "10.0.0.1"}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}],
            "dns": {"nameservers": ["10.96.0.10"]}
        });
        if legacy {
            expected["ips"][0]["version"] = json!("4");
        } else {
            // 1.x interfaces carry the MTU; 0.x has no such field.
            expected["interfaces"][0]["mtu"] = json!(1400);
            expected["interfaces"][1]["mtu"] = json!(1400);
        }
        assert_eq!(result, expected, "{version}");
    }
    let state = served.agent.state();
    let sent = &state.creates[0];
    assert_eq!(sent.container_id, "c1");
    assert_eq!(sent.netns, "/run/netns/pod-1");
    assert_eq!(sent.ifname, "eth0");
    assert_eq!(sent.pod_namespace, "default");
    assert_eq!(sent.pod_name, "web-0");
    assert_eq!(sent.network, "cellium");
    assert_eq!(sent.mtu, 1400);
    assert!(sent.requested_ips.is_empty());
}

#[test]
fn requested_addresses_reach_the_agent_by_precedence() {
    let served = serve(Scripted::default());
    let mut e = env("ADD", "c2");
    e.retain(|(k, _)| *k != "CNI_ARGS");
    e.push(("CNI_ARGS", "IP=10.0.0.77"));
    run(&e, &conf("1.1.0", &served.socket)).ok();
    let mut c = conf("1.1.0", &served.socket);
    c["runtimeConfig"] = json!({"ips": ["10.0.0.88/32"]});
    let out = run(&e, &c);
    assert_eq!(out.ok().json()["ips"][0]["address"], "10.0.0.88/32");
    let state = served.agent.state();
    assert_eq!(state.creates[0].requested_ips, ["10.0.0.77"]);
    assert_eq!(state.creates[1].requested_ips, ["10.0.0.88/32"]);
}

#[test]
fn add_in_a_chain_appends_to_the_prev_result() {
    let served = serve(Scripted::default());
    let mut c = conf("1.1.0", &served.socket);
    // A 0.4.0 result from an earlier plugin is converted, kept first, and indices shift.
    c["prevResult"] = json!({
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "net0", "sandbox": "/run/netns/pod-1"}],
        "ips": [{"version": "4", "interface": 0, "address": "192.168.5.5/24"}],
        "dns": {"nameservers": ["192.168.5.1"]}
    });
    let result = run(&env("ADD", "c3"), &c).ok().json();
    assert_eq!(result["cniVersion"], "1.1.0");
    let names: Vec<&str> = result["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["net0", "lxc0001", "eth0"]);
    assert_eq!(
        result["ips"],
        json!([
            {"interface": 0, "address": "192.168.5.5/24"},
            {"interface": 2, "address": "10.0.0.5/32", "gateway": "10.0.0.1"}
        ])
    );
    assert_eq!(
        result["dns"]["nameservers"],
        json!(["192.168.5.1", "10.96.0.10"])
    );
}

#[test]
fn a_bad_prev_result_fails_add_before_anything_is_created() {
    let served = serve(Scripted::default());
    let mut c = conf("1.0.0", &served.socket);
    c["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "nope"}]});
    let msg = run(&env("ADD", "c4"), &c).error(6);
    assert!(msg.contains("ips[0].address"), "{msg}");
    assert!(served.agent.state().creates.is_empty());
}

#[test]
fn agent_failures_map_to_the_documented_codes() {
    let cases = [
        (
            Status::resource_exhausted("pool 10.0.0.0/30 is full"),
            103,
            "larger pod CIDR",
        ),
        (
            Status::already_exists("10.0.0.9 is held by endpoint 3"),
            104,
            "another address",
        ),
        (
            Status::invalid_argument("ifname is empty"),
            101,
            "ifname is empty",
        ),
        (
            Status::not_found("netns /run/netns/pod-1 does not exist"),
            102,
            "CNI_NETNS",
        ),
        (
            Status::unavailable("restoring endpoints"),
            11,
            "retry later",
        ),
        (Status::internal("netlink: EPERM"), 100, "agent's log"),
        (Status::permission_denied("no"), 106, "root"),
        (Status::unimplemented("no Create"), 107, "same release"),
    ];
    for (status, code, needle) in cases {
        let served = serve(Scripted::default());
        served.agent.state().create_error = Some(status.clone());
        let msg = run(&env("ADD", "c5"), &conf("1.1.0", &served.socket)).error(code);
        assert!(msg.contains("Endpoints.Create failed"), "{msg}");
        assert!(msg.contains(status.message()), "{msg}");
        assert!(msg.contains(needle), "{code}: {msg}");
    }
}

#[test]
fn del_is_idempotent_and_needs_neither_netns_nor_prev_result() {
    let served = serve(Scripted::default());
    let c = conf("0.4.0", &served.socket);
    run(&env("ADD", "c6"), &c).ok();
    let mut e = env("DEL", "c6");
    e.retain(|(k, _)| *k != "CNI_NETNS");
    for _ in 0..2 {
        let out = run(&e, &c);
        out.ok();
        assert_eq!(out.stdout, "", "DEL prints nothing on success");
    }
    // A DEL that follows a failed ADD: nothing was created, no prevResult.
    run(&env("DEL", "never-added"), &conf("1.1.0", &served.socket)).ok();
    let state = served.agent.state();
    assert!(state.endpoints.is_empty());
    assert_eq!(state.deletes.len(), 3);
    assert_eq!(state.deletes[0].netns, "");
}

#[test]
fn check_compares_prev_result_and_the_agent_record() {
    let served = serve(Scripted::default());
    let c = conf("1.0.0", &served.socket);
    let added = run(&env("ADD", "c7"), &c).ok().json();
    let mut check = c.clone();
    check["prevResult"] = added.clone();
    let out = run(&env("CHECK", "c7"), &check);
    out.ok();
    assert_eq!(out.stdout, "");

    // prevResult without the endpoint's address.
    let mut wrong = added.clone();
    wrong["ips"][0]["address"] = json!("10.0.0.99/32");
    check["prevResult"] = wrong;
    let msg = run(&env("CHECK", "c7"), &check).error(105);
    assert!(
        msg.contains("address 10.0.0.5/32 of endpoint 1 is not in prevResult"),
        "{msg}"
    );

    // The agent finds the pod's network changed.
    check["prevResult"] = added;
    served.agent.state().check_error = Some(Status::failed_precondition(
        "route 0.0.0.0/0 via 10.0.0.1 is missing in /run/netns/pod-1",
    ));
    let msg = run(&env("CHECK", "c7"), &check).error(105);
    assert!(
        msg.contains("route 0.0.0.0/0 via 10.0.0.1 is missing"),
        "{msg}"
    );

    // No prevResult at all.
    let msg = run(&env("CHECK", "c7"), &c).error(7);
    assert!(msg.contains("prevResult"), "{msg}");
}

#[test]
fn status_reports_health_and_free_addresses() {
    let pool = |used, capacity| IpPool {
        cidr: "10.0.0.0/28".into(),
        source: "config".into(),
        capacity,
        used,
        ..IpPool::default()
    };
    let served = serve(Scripted::default());
    let c = conf("1.1.0", &served.socket);
    served.agent.state().pools = vec![pool(3, 13)];
    let out = run(&[("CNI_COMMAND", "STATUS")], &c);
    out.ok();
    assert_eq!(out.stdout, "");

    served.agent.state().pools = vec![pool(13, 13)];
    let msg = run(&[("CNI_COMMAND", "STATUS")], &c).error(50);
    assert!(msg.contains("exhausted (10.0.0.0/28 13/13 used)"), "{msg}");

    served.agent.state().pools = vec![pool(3, 13)];
    served.agent.state().health = Some((
        HealthLevel::Degraded,
        vec![HealthNode {
            id: "loader".into(),
            level: HealthLevel::Degraded as i32,
            message: "cannot attach to lxc0001".into(),
            ..HealthNode::default()
        }],
    ));
    let msg = run(&[("CNI_COMMAND", "STATUS")], &c).error(51);
    assert!(
        msg.contains("loader degraded: cannot attach to lxc0001"),
        "{msg}"
    );
}

#[test]
fn gc_sends_the_valid_attachments_of_the_network() {
    let served = serve(Scripted::default());
    let c = conf("1.1.0", &served.socket);
    run(&env("ADD", "keep"), &c).ok();
    run(&env("ADD", "stale"), &c).ok();
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "eth0"}]);
    let out = run(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")], &gc);
    out.ok();
    let state = served.agent.state();
    assert_eq!(state.gcs[0].network, "cellium");
    assert_eq!(state.gcs[0].valid.len(), 1);
    assert_eq!(state.gcs[0].valid[0].container_id, "keep");
    let left: Vec<&str> = state
        .endpoints
        .iter()
        .map(|e| e.container_id.as_str())
        .collect();
    assert_eq!(left, ["keep"]);
}
