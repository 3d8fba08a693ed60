//! A real runtime drives the plugin: rootful podman 4.3 through its CNI backend, with a
//! configuration and storage of its own under a temporary directory, containers from a
//! busybox-static root filesystem (no image pull). The conflist declares the `portMappings`
//! capability, so `podman run -p` reaches the plugin as `runtimeConfig.portMappings` and the
//! agent publishes the port in the datapath: no `portmap` plugin in the chain.
//!
//! Root, after `cargo build --workspace` and `scripts/setup.sh` (podman, runc, busybox-static):
//! `cargo test -p cellium-integration --test podman -- --test-threads=1`.
//! Nothing is skipped: if podman cannot run, the test fails and says why.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cellium_integration::lab::External;
use cellium_integration::lab::external::NODE_LINK_IP;
use cellium_integration::lab::service_bed::frontends;
use cellium_integration::wait::{eventually_or, wait_for};
use cellium_integration::{Agent, AgentOptions, NetNs, serial};
use serde_json::json;

/// Commands the containers run; each becomes a symlink to busybox in the root filesystem.
const APPLETS: &[&str] = &["sh", "sleep", "httpd", "nc", "printf", "cat", "ip"];

/// Where Debian's busybox-static installs the binary.
const BUSYBOX: &str = "/bin/busybox";

/// Podman with its own configuration, storage and CNI network; removes every container and
/// its directory on drop.
struct Podman {
    dir: tempfile::TempDir,
    network: String,
}

impl Podman {
    fn new(agent: &Agent) -> Podman {
        let dir = tempfile::Builder::new()
            .prefix("cel-podman-")
            .tempdir()
            .expect("temp dir");
        let network = format!("cel{}", std::process::id());
        let p = Podman { dir, network };
        let root = p.dir.path();
        let plugin_dirs = [
            agent.binaries().dir().display().to_string(),
            "/usr/lib/cni".to_string(),
        ];
        write(
            &root.join("containers.conf"),
            &format!(
                r#"[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{root}/events.log"
tmp_dir = "{root}/tmp"
static_dir = "{root}/storage/libpod"
volume_path = "{root}/storage/volumes"

[network]
network_backend = "cni"
network_config_dir = "{root}/cni"
cni_plugin_dirs = {dirs:?}
"#,
                root = root.display(),
                dirs = plugin_dirs,
            ),
        );
        write(
            &root.join("storage.conf"),
            &format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{0}/storage\"\nrunroot = \"{0}/run\"\n",
                root.display()
            ),
        );
        // Podman 4.3 reads CNI results up to 1.0.0 (it rejects 1.1.0 results).
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": p.network,
            "plugins": [{
                "type": "cellium-cni",
                "socket": agent.socket(),
                "log-file": root.join("cni.log"),
                "capabilities": {"portMappings": true},
            }],
        });
        write(
            &root.join("cni").join(format!("{}.conflist", p.network)),
            &conflist.to_string(),
        );
        p
    }

    /// A root filesystem of busybox-static with a page for httpd saying `banner`.
    fn rootfs(&self, name: &str, banner: &str) -> PathBuf {
        let rootfs = self.dir.path().join("rootfs").join(name);
        for d in ["bin", "www", "etc", "tmp"] {
            std::fs::create_dir_all(rootfs.join(d)).expect("rootfs dir");
        }
        assert!(
            Path::new(BUSYBOX).is_file(),
            "{BUSYBOX} is missing: install busybox-static (scripts/setup.sh)"
        );
        std::fs::copy(BUSYBOX, rootfs.join("bin/busybox")).expect("copy busybox");
        for applet in APPLETS {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))
                .expect("applet link");
        }
        write(&rootfs.join("www/index.html"), &format!("{banner}\n"));
        rootfs
    }

    fn command(&self, args: &[&str]) -> Command {
        let root = self.dir.path();
        let mut cmd = Command::new("podman");
        cmd.env("CONTAINERS_CONF", root.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", root.join("storage.conf"))
            .env("TMPDIR", root.join("tmp"))
            .args(args);
        cmd
    }

    /// Runs podman; panics with its stderr unless it succeeds. Returns stdout.
    fn run(&self, args: &[&str]) -> String {
        let out = self
            .command(args)
            .output()
            .expect("podman runs (scripts/setup.sh installs it)");
        assert!(
            out.status.success(),
            "podman {} failed ({}):\n{}\nplugin log:\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.path().join("cni.log")).unwrap_or_default()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Starts `name` detached on the network, serving its page on port 8080.
    fn start_server(&self, name: &str, rootfs: &Path) {
        self.start_server_with(name, rootfs, &[]);
    }

    /// [`Podman::start_server`] with more `podman run` options (`-p 18081:8080`, say).
    fn start_server_with(&self, name: &str, rootfs: &Path, options: &[&str]) {
        let rootfs = rootfs.display().to_string();
        let mut args = vec!["run", "-d", "--name", name, "--network", &self.network];
        args.extend_from_slice(options);
        args.extend_from_slice(&[
            "--rootfs",
            &rootfs,
            "/bin/httpd",
            "-f",
            "-p",
            "8080",
            "-h",
            "/www",
        ]);
        self.run(&args);
    }

    fn ip_of(&self, name: &str) -> String {
        let format = format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
            self.network
        );
        self.run(&["inspect", "-f", &format, name])
    }

    fn plugin_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("cni.log")).unwrap_or_default()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Stops and removes every container (each DEL reaches the agent, still running: the
        // agent guard is declared first, so it drops last), unmounting what podman mounted.
        let _ = self.command(&["rm", "-a", "-f", "-t", "0"]).output();
        if std::thread::panicking() {
            eprintln!("---- plugin log ----\n{}", self.plugin_log());
        }
    }
}

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("config dir");
    }
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// The endpoint of the pod podman names `name` (podman sends `K8S_POD_NAME`, no namespace).
fn endpoint_of(agent: &Agent, name: &str) -> Option<serde_json::Value> {
    agent
        .endpoints()
        .expect("endpoint list")
        .into_iter()
        .find(|e| e["pod"] == format!("default/{name}"))
}

#[test]
fn podman_containers_reach_each_other_and_stopping_one_deletes_its_endpoint() {
    let agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    let podman = Podman::new(&agent);
    let version = podman.run(&["version", "--format", "{{.Client.Version}}"]);
    assert!(version.starts_with('4'), "podman {version}");

    let (c1, c2) = (
        format!("cel-c1-{}", std::process::id()),
        format!("cel-c2-{}", std::process::id()),
    );
    podman.start_server(&c1, &podman.rootfs("c1", "hello from c1"));
    podman.start_server(&c2, &podman.rootfs("c2", "hello from c2"));
    let (ip1, ip2) = (podman.ip_of(&c1), podman.ip_of(&c2));
    assert_ne!(ip1, ip2);

    // Podman's view and the agent's agree.
    for (name, ip) in [(&c1, &ip1), (&c2, &ip2)] {
        let ep = endpoint_of(&agent, name).unwrap_or_else(|| panic!("no endpoint for {name}"));
        assert_eq!(ep["state"], "ready", "{ep}");
        assert_eq!(ep["addresses"][0], format!("{ip}/32"), "{ep}");
    }

    // Each reaches the other over TCP. (busybox-static's wget crashes without the NSS modules
    // its static glibc wants; nc speaks plain sockets.)
    let fetch = |from: &str, ip: &str| {
        let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} 8080");
        podman.run(&["exec", from, "/bin/sh", "-c", &script])
    };
    let page = fetch(&c1, &ip2);
    assert!(
        page.starts_with("HTTP/1.") && page.ends_with("hello from c2"),
        "{page}"
    );
    let page = fetch(&c2, &ip1);
    assert!(
        page.starts_with("HTTP/1.") && page.ends_with("hello from c1"),
        "{page}"
    );

    // Stopping a container tears its network down: DEL reaches the agent.
    podman.run(&["stop", "-t", "1", &c1]);
    let began = Instant::now();
    while endpoint_of(&agent, &c1).is_some() {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the endpoint of the stopped {c1} is still there; plugin log:\n{}",
            podman.plugin_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let held: Vec<String> = agent
        .pools()
        .unwrap()
        .iter()
        .flat_map(|p| p["allocations"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a["ip"].as_str().map(str::to_string))
        .collect();
    assert!(!held.contains(&ip1), "{ip1} still held: {held:?}");
    assert!(held.contains(&ip2));
    assert!(endpoint_of(&agent, &c2).is_some());
    let log = podman.plugin_log();
    assert!(
        log.lines()
            .any(|l| l.contains(" DEL ") && l.contains(" ok ")),
        "{log}"
    );
}

/// The page at `to`, fetched from inside `ns` with a plain HTTP/1.0 request.
fn page_from(ns: &NetNs, to: SocketAddr) -> std::io::Result<String> {
    ns.run(move || -> std::io::Result<String> {
        let mut conn = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        conn.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
        let mut page = String::new();
        conn.read_to_string(&mut page)?;
        Ok(page)
    })
    .map_err(|e| std::io::Error::other(e.to_string()))?
}

/// The port `podman run -p` publishes in the published-port test.
const PUBLISHED: u16 = 18081;

#[test]
fn podman_run_publish_serves_the_containers_port_at_the_nodes_address_until_it_stops() {
    let _serial = serial();
    let agent = Agent::start_new(AgentOptions::default()).expect("start the agent");
    // The outside: a namespace routed to the node over celx0 (10.98.0.1).
    let external = External::attach(agent.node(), &AgentOptions::default().pod_cidrs)
        .expect("the external network");
    let podman = Podman::new(&agent);

    let name = format!("cel-pub-{}", std::process::id());
    let publish = format!("{PUBLISHED}:8080");
    podman.start_server_with(
        &name,
        &podman.rootfs("pub", "hello from the published port"),
        &["-p", &publish],
    );
    // The mapping came with the ADD and is kept on the endpoint.
    let ep = endpoint_of(&agent, &name).expect("the container's endpoint");
    assert_eq!(
        ep["port_mappings"],
        json!([format!("{PUBLISHED}->8080/TCP")]),
        "{ep}"
    );
    let frontend = wait_for(
        "the published port's frontend on the node's address",
        || {
            frontends(&agent).into_iter().find(|f| {
                f["kind"] == "HostPort"
                    && f["port"] == PUBLISHED
                    && f["vip"] == NODE_LINK_IP.to_string()
            })
        },
    );
    assert_eq!(frontend["service"], format!("default/{name}"), "{frontend}");
    assert_eq!(frontend["backends_from"], "port-mappings", "{frontend}");

    // From outside the node, at the node's address and the published port.
    let at = SocketAddr::new(NODE_LINK_IP.into(), PUBLISHED);
    let page = wait_for("the published port answering from outside", || {
        page_from(external.netns(), at).ok()
    });
    assert!(
        page.starts_with("HTTP/1.") && page.trim_end().ends_with("hello from the published port"),
        "{page}"
    );

    // Stopping and removing the container takes the port away (DEL reaches the agent).
    podman.run(&["stop", "-t", "1", &name]);
    podman.run(&["rm", &name]);
    eventually_or(
        "the endpoint and the published port gone",
        || podman.plugin_log(),
        || {
            endpoint_of(&agent, &name).is_none()
                && frontends(&agent).iter().all(|f| f["kind"] != "HostPort")
        },
    );
    eventually_or(
        "the published port no longer answering from outside",
        || podman.plugin_log(),
        || page_from(external.netns(), at).is_err(),
    );
}
