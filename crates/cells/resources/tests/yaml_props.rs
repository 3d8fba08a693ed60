//! Property tests of the YAML decoder behind `apply` and `delete`: whatever the text, the
//! answer is objects or an error, never a panic or a hang, and a refused text changes nothing.

use cellium_resources::Resources;
use proptest::prelude::*;

/// Pieces of YAML and of the kinds apply knows, so that random texts reach deep into the
/// decoder rather than failing on the first character.
const TOKENS: &[&str] = &[
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ": ",
    "- ",
    "? ",
    "\n",
    "  ",
    "\t",
    "#",
    " # c\n",
    "'",
    "\"",
    "\\",
    "&a ",
    "*a",
    "!!str ",
    "!t ",
    "|\n",
    ">-\n",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "a",
    "0x1F",
    "1e3",
    "~",
    "null",
    "true",
    "<<: *a\n",
    "\u{feff}",
    "\u{0}",
    "é",
    "apiVersion: v1\n",
    "kind: Pod\n",
    "kind: Namespace\n",
    "kind: Service\n",
    "kind: List\nitems:\n",
    "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n",
    "apiVersion: cilium.io/v2\n",
    "kind: CiliumNetworkPolicy\n",
    "metadata: {name: x, namespace: default}\n",
    "spec:\n",
    "podSelector: {}\n",
    "ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}}]}]\n",
    "ports: [{port: 80}]\n",
    "endpointSelector: {}\n",
    "egress:\n- toEntities: [world]\n",
    "containers: [{name: c}]\n",
    "clusterIP: 10.96.0.10\n",
    "labels: {a: b}\n",
];

fn token_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..200).prop_map(|t| t.concat())
}

/// Arbitrarily deep nesting of flow and block collections.
fn nested() -> impl Strategy<Value = String> {
    (
        1usize..5000,
        prop::sample::select(&["[", "{a: ", "- ", "{", "[a, "][..]),
        any::<bool>(),
    )
        .prop_map(|(depth, open, close)| {
            let close_with = match open {
                "[" | "[a, " => "]",
                "- " => "",
                _ => "}",
            };
            let tail = if close {
                close_with.repeat(depth)
            } else {
                String::new()
            };
            format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}x{tail}\n",
                open.repeat(depth)
            )
        })
}

fn check(text: &str) {
    let r = Resources::new();
    let before = r.namespaces.len();
    match r.apply("p.yaml", text) {
        Ok(outcomes) => assert!(!outcomes.is_empty()),
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert_eq!(r.namespaces.len(), before, "a refused text changed nothing");
            assert!(r.pods.is_empty() && r.network_policies.is_empty());
        }
    }
    let _ = r.delete("p.yaml", text);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_text_gives_objects_or_an_error(text in ".{0,400}") {
        check(&text);
    }

    #[test]
    fn arbitrary_bytes_gives_objects_or_an_error(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        check(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn yaml_token_soup_gives_objects_or_an_error(text in token_soup()) {
        check(&text);
    }

    #[test]
    fn deep_nesting_is_refused_or_shallow_enough(text in nested()) {
        let r = Resources::new();
        if let Err(e) = r.apply("p.yaml", &text) {
            let e = e.to_string();
            prop_assert!(
                e.contains("apply-max-depth") || e.contains("invalid YAML") || e.contains("metadata.name"),
                "{}", e
            );
        }
    }
}
