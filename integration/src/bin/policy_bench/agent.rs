//! The agent under the benchmark's cluster: every pod a real endpoint created through
//! `cellium-cni`, the policies applied through the API, and the time from an Apply call to
//! the moment `Endpoints.List` reports every endpoint at the new revision.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cellium_api::v1::endpoints_client::EndpointsClient;
use cellium_api::v1::policy_client::PolicyClient;
use cellium_api::v1::resources_client::ResourcesClient;
use cellium_api::v1::{ApplyRequest, GetPolicyRequest, ListEndpointsRequest};
use cellium_integration::{Agent, AgentOptions, CniCall, CniProcess, NetNs};
use tonic::transport::Channel;

use crate::workload::Shape;

/// How many CNI ADDs run at once while the pods are created.
const PARALLEL_ADDS: usize = 8;

/// What was measured.
#[derive(Debug, Default)]
pub struct Figures {
    /// Endpoints.
    pub endpoints: usize,
    /// Time to create them all (s).
    pub create_s: f64,
    /// Each apply or delete of the policy that changes every endpoint.
    pub change_all: Vec<Duration>,
    /// Each apply or delete of the policy that changes no endpoint.
    pub change_none: Vec<Duration>,
    /// Each new pod whose identity the hundred namespace selectors select: from its CNI ADD
    /// to every endpoint at the new revision, and the ADD alone.
    pub new_pod: Vec<(Duration, Duration)>,
    /// Each of 20 `Endpoints.List` calls with every endpoint in place, back to back.
    pub list: Vec<Duration>,
    /// The agent's resident memory just after it started (KiB).
    pub rss_idle_kib: u64,
    /// The agent's resident memory with every endpoint and policy (KiB).
    pub rss_loaded_kib: u64,
}

/// The API clients the measurement polls with.
struct Api {
    endpoints: EndpointsClient<Channel>,
    policy: PolicyClient<Channel>,
    resources: ResourcesClient<Channel>,
}

impl Api {
    async fn revision(&mut self) -> Result<u64> {
        Ok(self
            .policy
            .get(GetPolicyRequest {})
            .await?
            .into_inner()
            .revision)
    }

    /// The lowest and highest revision the endpoints report, and how many there are.
    async fn enforced(&mut self) -> Result<(u64, u64, usize)> {
        let eps = self
            .endpoints
            .list(ListEndpointsRequest {})
            .await?
            .into_inner()
            .endpoints;
        let lowest = eps.iter().map(|e| e.policy_revision).min().unwrap_or(0);
        let highest = eps.iter().map(|e| e.policy_revision).max().unwrap_or(0);
        Ok((lowest, highest, eps.len()))
    }

    /// Waits until every endpoint reports one revision past `before` that is the repository's
    /// own, and returns the moment the endpoints first all reported it. Only `Endpoints.List`
    /// is polled while waiting (what a user would watch); the repository's revision is read
    /// once they agree, and if it has moved on meanwhile, the wait goes on.
    async fn settled_after(&mut self, before: u64) -> Result<Instant> {
        let began = Instant::now();
        loop {
            crate::interrupted()?;
            let (lowest, highest, _) = self.enforced().await?;
            let at = Instant::now();
            if lowest > before && lowest == highest && self.revision().await? == lowest {
                return Ok(at);
            }
            if began.elapsed() > Duration::from_secs(120) {
                bail!("endpoints did not reach a revision past {before} within 2 minutes");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Applies (or deletes) `yaml` and returns the time until every endpoint enforces it.
    async fn timed(&mut self, yaml: &str, delete: bool) -> Result<Duration> {
        // Nothing may be in flight when the clock starts.
        let before = self.revision().await?;
        let (lowest, highest, _) = self.enforced().await?;
        if lowest != before || highest != before {
            bail!("endpoints at revisions {lowest}..={highest}, the repository at {before}");
        }
        let request = ApplyRequest {
            source: "bench.yaml".into(),
            yaml: yaml.into(),
        };
        let began = Instant::now();
        if delete {
            self.resources.delete(request).await?;
        } else {
            self.resources.apply(request).await?;
        }
        let done = self.settled_after(before).await?;
        Ok(done - began)
    }
}

/// The resident memory of process `pid` (KiB).
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/<pid>/status")
}

/// Starts an agent, creates the cluster of `shape`, and measures `rounds` applies and deletes
/// of each policy.
pub fn measure(shape: Shape, rounds: usize) -> Result<Figures> {
    let opts = AgentOptions {
        pod_cidrs: vec!["10.244.0.0/20".into()],
        ..AgentOptions::default()
    };
    let agent = Agent::start_new(opts).context("starting the agent")?;
    let pid = agent.pid().context("the agent's pid")?;
    let mut figures = Figures {
        rss_idle_kib: rss_kib(pid)?,
        ..Figures::default()
    };
    let dir = tempfile::tempdir()?;
    for (name, yaml) in [
        ("namespaces", shape.namespaces_yaml()),
        ("pods", shape.pods_yaml()),
        ("policies", shape.policies_yaml()),
    ] {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml)?;
        agent.cli(&["apply", "-f", &path.display().to_string()])?;
    }

    eprintln!("creating {} pods through cellium-cni ...", shape.pods);
    let began = Instant::now();
    let pods = create_pods(&agent, shape)?;
    figures.create_s = began.elapsed().as_secs_f64();
    eprintln!("... in {:.1} s", figures.create_s);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let channel = cellium_api::connect(agent.socket()).await?;
        let mut api = Api {
            endpoints: EndpointsClient::new(channel.clone()),
            policy: PolicyClient::new(channel.clone()),
            resources: ResourcesClient::new(channel),
        };
        let (_, _, n) = api.enforced().await?;
        figures.endpoints = n;
        if n != shape.pods {
            bail!("{n} endpoints for {} pods", shape.pods);
        }
        for _ in 0..20 {
            let began = Instant::now();
            api.enforced().await?;
            figures.list.push(began.elapsed());
        }
        for round in 0..rounds {
            crate::interrupted()?;
            for (yaml, out) in [
                (Shape::change_none_yaml(), &mut figures.change_none),
                (Shape::change_all_yaml(), &mut figures.change_all),
            ] {
                let apply = api.timed(yaml, false).await?;
                let delete = api.timed(yaml, true).await?;
                out.extend([apply, delete]);
            }
            eprintln!(
                "round {round}: every endpoint {:?} / {:?}, none {:?} / {:?} (apply / delete)",
                figures.change_all[2 * round],
                figures.change_all[2 * round + 1],
                figures.change_none[2 * round],
                figures.change_none[2 * round + 1]
            );
        }
        for round in 0..rounds {
            crate::interrupted()?;
            let timed = new_pod(&agent, &mut api, round).await?;
            eprintln!("new pod {round}: {:?} (ADD {:?})", timed.0, timed.1);
            figures.new_pod.push(timed);
        }
        anyhow::Ok(())
    })?;
    figures.rss_loaded_kib = rss_kib(pid)?;
    drop(pods);
    Ok(figures)
}

/// A new pod of `ns-0` that the hundred namespace selectors select, created through the CNI
/// plugin: the time from its ADD until every endpoint enforces the revision its identity
/// brought, and the time of the ADD alone. The pod is deleted again afterwards.
async fn new_pod(agent: &Agent, api: &mut Api, round: usize) -> Result<(Duration, Duration)> {
    let name = format!("new-{round}");
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {name}, namespace: ns-0, labels: {{ app: {name}, group: g-0, tier: t-new }} }}\nspec: {{ containers: [ {{ name: c }} ] }}\n"
    );
    let request = || ApplyRequest {
        source: "new-pod.yaml".into(),
        yaml: yaml.clone(),
    };
    api.resources.apply(request()).await?;
    let ns = NetNs::new()?;
    let id = format!("benchnew{round}x{}", std::process::id());
    let before = api.revision().await?;
    let began = Instant::now();
    let call = CniCall::new("ADD", &id)
        .netns(ns.path())
        .args(&format!("K8S_POD_NAMESPACE=ns-0;K8S_POD_NAME={name}"));
    wait_add(agent.spawn_cni(&call)?)?;
    let added = began.elapsed();
    let done = api.settled_after(before).await?;
    let before = api.revision().await?;
    let (status, out) = agent.cni(&CniCall::new("DEL", &id).netns(ns.path()))?;
    if !status.success() {
        bail!("CNI DEL failed ({status}): {out}");
    }
    api.resources.delete(request()).await?;
    api.settled_after(before).await?;
    Ok((done - began, added))
}

/// One network namespace per pod and a CNI ADD for each, a few at a time, as a kubelet
/// starting many pods would.
fn create_pods(agent: &Agent, shape: Shape) -> Result<Vec<NetNs>> {
    let mut netns = Vec::with_capacity(shape.pods);
    for _ in 0..shape.pods {
        crate::interrupted()?;
        netns.push(NetNs::new()?);
    }
    let mut running: VecDeque<CniProcess> = VecDeque::new();
    for (i, ns) in netns.iter().enumerate() {
        let key = shape.pod_key(i);
        let (pod_ns, name) = key.split_once('/').context("pod key")?;
        let call = CniCall::new("ADD", &format!("bench{i}x{}", std::process::id()))
            .netns(ns.path())
            .args(&format!("K8S_POD_NAMESPACE={pod_ns};K8S_POD_NAME={name}"));
        crate::interrupted()?;
        if running.len() >= PARALLEL_ADDS
            && let Some(p) = running.pop_front()
        {
            wait_add(p)?;
        }
        running.push_back(agent.spawn_cni(&call)?);
    }
    for p in running {
        wait_add(p)?;
    }
    Ok(netns)
}

fn wait_add(p: CniProcess) -> Result<Ipv4Addr> {
    let (status, out) = p.wait()?;
    if !status.success() {
        bail!("CNI ADD failed ({status}): {out}");
    }
    cellium_integration::cni::result_ipv4(&out).context("no address in the ADD result")
}
