//! Property tests of the parsers that read what the runtime passes: whatever the input, the
//! network configuration and `CNI_ARGS` parse or fail with the spec's code for bad input, and
//! never panic or hang.

use std::sync::mpsc;
use std::time::Duration;

use cellium_cni::args::CniArgs;
use cellium_cni::config::{self, NetConf};
use cellium_cni::{Error, Verb};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Runs `f` on a thread of its own and fails if it does not return within a generous bound: a
/// parser that loops on some input shows up as a failure, not as a stuck suite.
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the parser did not return in 10 s"),
        // The thread panicked: its message is already on stderr.
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the parser panicked"),
    }
}

const VERBS: [Verb; 6] = [
    Verb::Add,
    Verb::Del,
    Verb::Check,
    Verb::Status,
    Verb::Gc,
    Verb::Version,
];

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        // Around the port range, so that some published ports are valid.
        (-2i64..70000).prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,24}".prop_map(Value::String),
        prop_oneof![
            Just("1.1.0"),
            Just("0.3.1"),
            Just("/run/x.sock"),
            Just("10.0.0.5/24"),
            Just("90s"),
            Just("fd00::5"),
            Just("tcp"),
            Just("UDP"),
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Keys the plugin reads, nested ones included, and arbitrary others.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "cniVersion",
            "name",
            "type",
            "socket",
            "mtu",
            "dns",
            "timeout",
            "log-file",
            "prevResult",
            "runtimeConfig",
            "args",
            "cni",
            "ips",
            "portMappings",
            "hostPort",
            "containerPort",
            "protocol",
            "hostIP",
            "HostPort",
            "cni.dev/valid-attachments",
            "containerID",
            "ifname",
            "nameservers",
            "interfaces",
            "address",
        ])
        .prop_map(String::from),
        ".{0,12}",
    ]
}

/// A configuration object: mostly the plugin's own keys, with any values.
fn config_object() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(key(), json_value(), 0..10).prop_map(|m| {
        let mut map: Map<String, Value> = m.into_iter().collect();
        // Often valid where it gates the rest, so the later keys are reached too.
        map.entry("name").or_insert(json!("cellium"));
        map.entry("cniVersion").or_insert(json!("1.1.0"));
        Value::Object(map)
    })
}

fn assert_input_error(e: &Error) {
    assert!(
        matches!(e.code(), 1 | 6 | 7),
        "code {} for bad configuration: {e}",
        e.code()
    );
    assert!(!e.to_string().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_are_a_configuration_or_a_decoding_error(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        for verb in VERBS {
            let input = bytes.clone();
            match bounded(move || NetConf::parse(&input, verb)) {
                Ok(_) => {}
                Err(e) => assert_input_error(&e),
            }
        }
        let input = bytes.clone();
        bounded(move || config::log_file(&input));
    }

    #[test]
    fn arbitrary_json_is_a_configuration_or_a_configuration_error(value in config_object()) {
        let text = value.to_string().into_bytes();
        for verb in VERBS {
            let input = text.clone();
            match bounded(move || NetConf::parse(&input, verb)) {
                Ok(conf) => {
                    // What parsed is usable: the requested addresses are canonical.
                    let args = CniArgs::default();
                    for ip in conf.requested_ips(&args) {
                        assert!(!ip.is_empty());
                    }
                    // Published ports are ports.
                    for m in &conf.port_mappings {
                        assert!(m.host_port > 0 && m.container_port > 0);
                    }
                }
                Err(e) => assert_input_error(&e),
            }
        }
    }

    #[test]
    fn arbitrary_cni_args_parse_or_fail_with_code_2_or_4(args in ".{0,200}") {
        let input = args.clone();
        match bounded(move || CniArgs::parse(Some(&input))) {
            Ok(_) => {}
            Err(e) => prop_assert!(matches!(e.code(), 2 | 4), "code {} for {args:?}: {e}", e.code()),
        }
    }

    #[test]
    fn cni_args_of_known_keys_and_any_values_parse_or_fail_with_code_2_or_4(
        pairs in prop::collection::vec(
            (
                prop_oneof![
                    prop::sample::select(vec![
                        "IgnoreUnknown", "K8S_POD_NAMESPACE", "K8S_POD_NAME",
                        "K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_UID", "IP",
                    ]).prop_map(String::from),
                    "[A-Za-z_]{1,8}",
                ],
                prop_oneof![
                    "[0-9a-f.:/,]{0,40}",
                    ".{0,20}",
                    Just("1".to_string()),
                    Just("true".to_string()),
                    Just("10.0.0.5,fd00::5".to_string()),
                ],
            ),
            0..8,
        )
    ) {
        let text: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let args = text.join(";");
        let input = args.clone();
        match bounded(move || CniArgs::parse(Some(&input))) {
            Ok(parsed) => {
                for ip in &parsed.ips {
                    prop_assert!(ip.parse::<std::net::IpAddr>().is_ok() || ip.contains('/'), "{ip}");
                }
            }
            Err(e) => prop_assert!(matches!(e.code(), 2 | 4), "code {} for {args:?}: {e}", e.code()),
        }
    }
}

#[test]
fn deeply_nested_json_is_refused_not_a_stack_overflow() {
    let deep = "[".repeat(100_000);
    let err = bounded(move || NetConf::parse(deep.as_bytes(), Verb::Add)).unwrap_err();
    assert_eq!(err.code(), 6, "{err}");
}
