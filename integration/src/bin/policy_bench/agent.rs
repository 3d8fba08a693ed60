//! The agent under the benchmark's cluster: every pod a real endpoint created through
//! `cellium-cni`, the policies applied through the API, and the time from an Apply call to
//! the moment `Endpoints.List` reports every endpoint at the new revision.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cellium_api::v1::ApplyRequest;
use cellium_integration::bench::{Api, Shape, create_pods, interrupted, pods::wait_add, rss_kib};
use cellium_integration::{Agent, AgentOptions, CniCall, NetNs};

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

/// Applies (or deletes) `yaml` and returns the time until every endpoint enforces it.
async fn timed(api: &mut Api, yaml: &str, delete: bool) -> Result<Duration> {
    // Nothing may be in flight when the clock starts.
    let before = api.revision().await?;
    let seen = api.enforced().await?;
    if seen.lowest != before || seen.highest != before {
        bail!(
            "endpoints at revisions {}..={}, the repository at {before}",
            seen.lowest,
            seen.highest
        );
    }
    let request = ApplyRequest {
        source: "bench.yaml".into(),
        yaml: yaml.into(),
    };
    let began = Instant::now();
    if delete {
        api.resources.delete(request).await?;
    } else {
        api.resources.apply(request).await?;
    }
    let done = api.settled_after(before).await?;
    Ok(done - began)
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
        let mut api = Api::connect(&agent.socket()).await?;
        let n = api.enforced().await?.endpoints;
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
            interrupted()?;
            for (yaml, out) in [
                (Shape::change_none_yaml(), &mut figures.change_none),
                (Shape::change_all_yaml(), &mut figures.change_all),
            ] {
                let apply = timed(&mut api, yaml, false).await?;
                let delete = timed(&mut api, yaml, true).await?;
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
            interrupted()?;
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
