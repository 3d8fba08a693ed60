//! `cellium connectivity test`: as `cilium connectivity test`, on the node the agent runs on.
//!
//! It makes its own pods, as a container runtime does: a network namespace each, given its
//! interface by the CNI plugin, with a Pod object applied to the agent for its labels. A
//! server runs in `echo`; a Service `echo` (ClusterIP and NodePort) is in front of it. Then it
//! checks what a node must do, each check retried until it holds or its time is up, prints a
//! table of pass and fail, and removes everything it made, also when a check fails or the
//! command is interrupted (SIGINT, SIGTERM). The servers and probes are this program run
//! again inside the pods' namespaces (`ip netns exec`), so nothing else is needed on the node.
//!
//! Standalone mode only: in Kubernetes mode the agent takes Pods from the API server and
//! refuses the test's objects, and the command says so. Pod to pod across nodes needs
//! another node: it is reported as skipped.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cellium_api::v1::services_client::ServicesClient;
use cellium_api::v1::{ApplyRequest, ListServicesRequest, resources_client::ResourcesClient};

use crate::output;

/// The namespace of the test's objects, as Cilium's `cilium-test`.
const NAMESPACE: &str = "cellium-test";
/// The port the echo server listens on in its pod.
const ECHO_PORT: u16 = 8080;
/// The Service's port.
const SERVICE_PORT: u16 = 80;
/// What the echo server answers, before its pod's name.
const GREETING: &str = "cellium-connectivity";

/// `cellium connectivity` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Make test pods, a Service and a policy on this node, check pod to pod, pod to
    /// Service, pod to NodePort, pod to the world and policy enforcement, print a table of
    /// the results and remove what was made. Root; the agent in standalone mode.
    Test(TestArgs),
    /// (Internal) the echo server the test runs in a pod.
    #[command(hide = true)]
    Serve {
        /// The address to listen on.
        listen: SocketAddr,
        /// The name it answers with.
        name: String,
    },
    /// (Internal) one probe the test runs in a pod: connect, read the answer, print it.
    #[command(hide = true)]
    Probe {
        /// The address to connect to.
        target: SocketAddr,
    },
}

/// Arguments of `cellium connectivity test`.
#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// The directory holding `cellium-cni` (default: this program's, else /opt/cni/bin).
    #[arg(long, value_name = "DIR")]
    cni_bin_dir: Option<PathBuf>,
    /// An address outside the cluster that accepts TCP connections, for pod to world.
    #[arg(long, value_name = "ADDR:PORT", default_value = "1.1.1.1:443")]
    external_target: SocketAddr,
    /// Checks to leave out, by name (repeatable): pod-to-world where nothing outside can be
    /// reached, say.
    #[arg(long, value_name = "CHECK")]
    skip: Vec<String>,
    /// How long each check may take to hold.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// Runs a `cellium connectivity` verb.
pub async fn exec(socket: &Path, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Test(args) => test(socket, args).await,
        Command::Serve { listen, name } => serve(listen, &name),
        Command::Probe { target } => probe(target),
    }
}

/// The pods the test makes: the echo server, a client the policy admits, another it does not.
const PODS: [&str; 3] = ["echo", "client", "other"];

/// What the test made, removed when dropped.
struct Lab {
    socket: PathBuf,
    plugin: PathBuf,
    prefix: String,
    pods: Vec<String>,
    servers: Vec<Child>,
    objects: bool,
}

async fn test(socket: &Path, args: TestArgs) -> anyhow::Result<()> {
    let plugin = find_plugin(args.cni_bin_dir.as_deref())?;
    let mut lab = Lab {
        socket: socket.to_path_buf(),
        plugin,
        prefix: format!("cellium-conn-{}", std::process::id()),
        pods: Vec::new(),
        servers: Vec::new(),
        objects: false,
    };
    // Interrupted, the run stops where it is and what it made is removed all the same.
    let result = tokio::select! {
        r = run(&mut lab, &args) => r,
        signal = interrupted() => Err(anyhow::anyhow!("{signal}: stopped, removing what the test made")),
    };
    lab.remove_objects().await;
    drop(lab);
    let results = result?;
    print(&results);
    let failed = results.iter().filter(|r| r.outcome.is_fail()).count();
    if failed > 0 {
        bail!("{failed} of {} checks failed", results.len());
    }
    Ok(())
}

/// Returns at SIGINT or SIGTERM, naming it.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// A check: `from` connects to `to`, which must answer (`want`) or not.
struct Check {
    name: &'static str,
    what: String,
    from: &'static str,
    to: SocketAddr,
    want: bool,
}

/// One check's result.
struct Checked {
    name: &'static str,
    what: String,
    outcome: Outcome,
}

enum Outcome {
    Pass(String),
    Fail(String),
    Skipped(String),
}

impl Outcome {
    fn is_fail(&self) -> bool {
        matches!(self, Outcome::Fail(_))
    }
}

async fn run(lab: &mut Lab, args: &TestArgs) -> anyhow::Result<Vec<Checked>> {
    lab.apply(&objects()).await?;
    lab.objects = true;
    let mut ips = Vec::new();
    for pod in PODS {
        ips.push(lab.add_pod(pod)?);
    }
    let echo = SocketAddr::new(ips[0], ECHO_PORT);
    lab.serve(echo)?;
    let (cluster_ip, node_port) = lab.frontends(args.timeout).await?;
    let world = args.external_target;
    let reach = |name, what: String, to| Check {
        name,
        what,
        from: "client",
        to,
        want: true,
    };

    let mut out = Vec::new();
    for check in [
        reach("pod-to-pod", format!("client -> echo {echo}"), echo),
        reach(
            "pod-to-service",
            format!("client -> Service echo {cluster_ip}"),
            cluster_ip,
        ),
    ] {
        out.push(lab.check(check, args).await);
    }
    match node_port {
        Some(np) => {
            let check = reach("pod-to-nodeport", format!("client -> NodePort {np}"), np);
            out.push(lab.check(check, args).await);
        }
        None => out.push(Checked {
            name: "pod-to-nodeport",
            what: "client -> NodePort".into(),
            outcome: Outcome::Fail("the Service has no NodePort frontend".into()),
        }),
    }
    let check = reach("pod-to-world", format!("client -> {world}"), world);
    out.push(lab.check(check, args).await);
    out.push(Checked {
        name: "pod-to-pod-other-node",
        what: "client -> a pod on another node".into(),
        outcome: Outcome::Skipped("one node: the agent is in standalone mode".into()),
    });
    lab.apply(&policy()).await?;
    let deny = Check {
        name: "policy-deny",
        what: format!("other -> echo {echo}, with a policy admitting client only"),
        from: "other",
        to: echo,
        want: false,
    };
    out.push(lab.check(deny, args).await);
    let allow = reach(
        "policy-allow",
        format!("client -> echo {echo}, with the same policy"),
        echo,
    );
    out.push(lab.check(allow, args).await);
    Ok(out)
}

/// The objects: the namespace, the pods' labels and the Service.
fn objects() -> String {
    let mut yaml = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n");
    for pod in PODS {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: {NAMESPACE}, \
             labels: {{app: {pod}}}}}\nspec: {{containers: [{{name: {pod}, ports: \
             [{{containerPort: {ECHO_PORT}}}]}}]}}\n"
        ));
    }
    yaml.push_str(&format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: echo, namespace: {NAMESPACE}}}\n\
         spec: {{type: NodePort, selector: {{app: echo}}, ports: [{{port: {SERVICE_PORT}, \
         targetPort: {ECHO_PORT}}}]}}\n"
    ));
    yaml
}

/// A policy admitting only the client into echo.
fn policy() -> String {
    format!(
        "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {{name: echo, namespace: \
         {NAMESPACE}}}\nspec:\n  endpointSelector: {{matchLabels: {{app: echo}}}}\n  ingress:\n  \
         - fromEndpoints: [{{matchLabels: {{app: client}}}}]\n"
    )
}

impl Lab {
    fn netns(&self, pod: &str) -> String {
        format!("{}-{pod}", self.prefix)
    }

    async fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        self.send(yaml, true).await
    }

    async fn send(&self, yaml: &str, apply: bool) -> anyhow::Result<()> {
        let mut client = ResourcesClient::new(cellium_api::connect(&self.socket).await?);
        let request = ApplyRequest {
            source: "cellium connectivity test".into(),
            yaml: yaml.to_string(),
        };
        let answer = if apply {
            client.apply(request).await
        } else {
            client.delete(request).await
        };
        answer
            .map(|_| ())
            .map_err(|s| anyhow::anyhow!("{}", output::reason(&s)))
            .context("the agent refused the test's objects (is it in Kubernetes mode?)")
    }

    /// The pod's namespace, its interface from the plugin; returns its IPv4 address.
    fn add_pod(&mut self, pod: &str) -> anyhow::Result<std::net::IpAddr> {
        let netns = self.netns(pod);
        run_cmd(Process::new("ip").args(["netns", "add", &netns]))?;
        self.pods.push(pod.to_string());
        let result = self.cni("ADD", pod)?;
        let result: serde_json::Value =
            serde_json::from_str(&result).context("the plugin's result")?;
        result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str()?.split('/').next()?.parse().ok())
            .find(std::net::IpAddr::is_ipv4)
            .with_context(|| format!("no IPv4 address for {pod} in {result}"))
    }

    fn cni(&self, verb: &str, pod: &str) -> anyhow::Result<String> {
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "cellium-connectivity",
            "type": "cellium-cni",
            "socket": self.socket,
        });
        let mut child = Process::new(&self.plugin)
            .env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", self.netns(pod))
            .env("CNI_NETNS", format!("/run/netns/{}", self.netns(pod)))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", self.plugin.parent().unwrap_or(Path::new("/")))
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME={pod}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("run {}", self.plugin.display()))?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(conf.to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "CNI {verb} of {pod}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(stdout)
    }

    /// The echo server in its pod.
    fn serve(&mut self, listen: SocketAddr) -> anyhow::Result<()> {
        let child = Process::new("ip")
            .args(["netns", "exec", &self.netns("echo")])
            .arg(std::env::current_exe()?)
            .args(["connectivity", "serve", &listen.to_string(), "echo"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("start the echo server")?;
        self.servers.push(child);
        Ok(())
    }

    /// The Service's ClusterIP frontend and its first NodePort one, once they have backends.
    async fn frontends(
        &self,
        timeout: Duration,
    ) -> anyhow::Result<(SocketAddr, Option<SocketAddr>)> {
        let mut client = ServicesClient::new(cellium_api::connect(&self.socket).await?);
        let began = Instant::now();
        loop {
            let frontends =
                output::answer(client.list(ListServicesRequest {}).await, "Services.List")?
                    .frontends;
            let ours = |kind: &str| {
                frontends.iter().find(|f| {
                    f.namespace == NAMESPACE
                        && f.name == "echo"
                        && f.kind == kind
                        && !f.backends.is_empty()
                        && f.vip.parse::<std::net::Ipv4Addr>().is_ok()
                })
            };
            let addr = |f: &cellium_api::v1::ServiceFrontend| {
                f.vip
                    .parse()
                    .ok()
                    .map(|ip| SocketAddr::new(ip, f.port as u16))
            };
            if let Some(cluster_ip) = ours("ClusterIP").and_then(addr) {
                return Ok((cluster_ip, ours("NodePort").and_then(addr)));
            }
            if began.elapsed() > timeout {
                bail!("the Service echo has no backends after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `check` unless it is skipped.
    async fn check(&self, check: Check, args: &TestArgs) -> Checked {
        let outcome = if args.skip.iter().any(|s| s == check.name) {
            Outcome::Skipped("--skip".into())
        } else {
            self.expect(check.from, check.to, check.want, args.timeout)
                .await
        };
        Checked {
            name: check.name,
            what: check.what,
            outcome,
        }
    }

    /// Probes `to` from `from` until the answer is what is wanted (an answer, or none for two
    /// seconds) or the time is up.
    async fn expect(&self, from: &str, to: SocketAddr, want: bool, timeout: Duration) -> Outcome {
        let began = Instant::now();
        loop {
            let answer = self.probe(from, to).await;
            let elapsed = began.elapsed();
            match (&answer, want) {
                (Ok(text), true) => return Outcome::Pass(format!("{text} ({elapsed:.1?})")),
                (Err(_), false) if elapsed > Duration::from_secs(2) => {
                    return Outcome::Pass("refused or dropped".into());
                }
                (Ok(text), false) if elapsed > timeout => {
                    return Outcome::Fail(format!("answered: {text}"));
                }
                (Err(e), true) if elapsed > timeout => return Outcome::Fail(e.to_string()),
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    async fn probe(&self, from: &str, to: SocketAddr) -> anyhow::Result<String> {
        let out = tokio::process::Command::new("ip")
            .args(["netns", "exec", &self.netns(from)])
            .arg(std::env::current_exe()?)
            .args(["connectivity", "probe", &to.to_string()])
            .kill_on_drop(true)
            .output()
            .await?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            bail!("{}", String::from_utf8_lossy(&out.stderr).trim())
        }
    }

    /// Deletes the objects (the policy and the Service, the pods, the namespace).
    async fn remove_objects(&mut self) {
        if std::mem::take(&mut self.objects) {
            let _ = self.send(&policy(), false).await;
            let _ = self.send(&objects(), false).await;
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for mut server in self.servers.drain(..) {
            let _ = server.kill();
            let _ = server.wait();
        }
        for pod in std::mem::take(&mut self.pods) {
            if let Err(e) = self.cni("DEL", &pod) {
                eprintln!("cellium: {e:#}");
            }
            let _ = Process::new("ip")
                .args(["netns", "del", &self.netns(&pod)])
                .status();
        }
    }
}

fn run_cmd(cmd: &mut Process) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn find_plugin(dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    let beside = std::env::current_exe()?.parent().map(Path::to_path_buf);
    let dirs: Vec<PathBuf> = match dir {
        Some(d) => vec![d.to_path_buf()],
        None => beside
            .into_iter()
            .chain([PathBuf::from("/opt/cni/bin")])
            .collect(),
    };
    dirs.iter()
        .map(|d| d.join("cellium-cni"))
        .find(|p| p.is_file())
        .with_context(|| format!("no cellium-cni in {dirs:?} (--cni-bin-dir)"))
}

fn print(results: &[Checked]) {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let (result, detail) = match &r.outcome {
                Outcome::Pass(d) => ("pass", d),
                Outcome::Fail(d) => ("FAIL", d),
                Outcome::Skipped(d) => ("skipped", d),
            };
            vec![
                r.name.to_string(),
                result.to_string(),
                r.what.clone(),
                detail.clone(),
            ]
        })
        .collect();
    output::print_table(&["CHECK", "RESULT", "WHAT", "DETAIL"], &rows);
}

/// Answers every connection with the greeting and `name`.
fn serve(listen: SocketAddr, name: &str) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).with_context(|| format!("listen on {listen}"))?;
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = writeln!(conn, "{GREETING} {name}");
    }
    Ok(())
}

/// Connects to `target` and prints the first line it answers.
fn probe(target: SocketAddr) -> anyhow::Result<()> {
    let conn = TcpStream::connect_timeout(&target, Duration::from_secs(1))
        .with_context(|| format!("connect to {target}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut line = String::new();
    // A server that is not ours (the world's) answers nothing first: connecting is enough.
    let _ = BufReader::new(conn).read_line(&mut line);
    let line = line.trim();
    println!("{}", if line.is_empty() { "connected" } else { line });
    Ok(())
}
