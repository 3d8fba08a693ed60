//! The `policy-repo` cell: the node's network policy rules and what each endpoint may do.
//!
//! - **Owns** the rules of every NetworkPolicy, CiliumNetworkPolicy and
//!   CiliumClusterwideNetworkPolicy, translated into one rule model with each kind's own
//!   semantics ([`translate`]); the selector cache ([`SelectorCache`]: each peer selector's
//!   identities, updated per identity event); one identity and ipcache entry per CIDR prefix
//!   that rules name; a revision that increases with every change.
//! - **Provides** `Arc<PolicyRepository>`: [`PolicyRepository::resolve`] (an endpoint's
//!   rules, exactly what `cellium_policy::compile` takes, cached per identity),
//!   [`PolicyRepository::changes`] (the revision, to regenerate endpoints),
//!   [`PolicyRepository::cidr_labels_for`] (the `cidr:` labels of the NetworkPolicy
//!   ipBlocks covering an endpoint's address, which its identity must carry),
//!   [`PolicyRepository::selected_keys`] (the pod label keys its selectors read, which
//!   identities keep although the label filter drops them); and the
//!   `cellium.v1.Policy` gRPC service (`cellium policy get|selectors`).
//! - **Depends on** `Arc<Resources>` (the policy tables), `Arc<Identities>` and `Arc<Ipcache>`
//!   (where it puts its CIDR prefixes, and whose named ports per identity, which endpoints'
//!   owners put there, egress rules' port names resolve against:
//!   [`PolicyRepository::sync_named_ports`]).
//! - **Config keys:** `policy-audit-mode` ([`PolicyConfig`]; the policy directory,
//!   `policy-dir`, is a feed of the resources cell).
//! - **Degraded** when a policy that passed validation cannot be enforced (it is then not
//!   enforced at all), and when a CIDR identity or ipcache entry cannot be set up.
//!
//! Where to start: `docs/policy.md` describes the semantics, with the places where they
//! differ between NetworkPolicy and Cilium's kinds.
//!
//! ```
//! use cellium_identity::Identities;
//! use cellium_labels::Labels;
//! use cellium_policy_repo::{PolicyRepository, Subject};
//! use cellium_resources::Resources;
//!
//! let resources = Resources::new();
//! resources.apply("np.yaml", "
//! apiVersion: networking.k8s.io/v1
//! kind: NetworkPolicy
//! metadata: { name: deny-all }
//! spec: { podSelector: {} }
//! ").unwrap();
//! let repo = PolicyRepository::with_parts(Identities::in_memory(), None, None);
//! repo.sync_resources(&resources);
//! let labels = Labels::for_pod("default", &Default::default(), &Default::default());
//! let policy = repo.resolve(&Subject { identity: 300, labels: &labels, named_ports: &[] });
//! assert!(policy.ingress_enforced && !policy.egress_enforced);
//! // Only the node itself may connect (allow-localhost).
//! assert_eq!(policy.rules.len(), 1);
//! assert_eq!(policy.rules[0].identity, 1);
//! ```

mod cidr;
mod config;
mod error;
mod feed;
mod grpc;
mod lockdown;
mod repository;
mod resolve;
pub mod rule;
mod selected_keys;
mod selector_cache;
pub mod translate;

use cellium_hive::Module;

pub use config::PolicyConfig;
pub use error::{Error, Result};
pub use grpc::PolicyService;
pub use repository::{PolicyRepository, RuleInfo, SelectorInfo};
pub use resolve::{EndpointPolicy, Origins, Outcome, PeerPolicy, Subject};
pub use selected_keys::{KeyUse, LabelKeyInfo, SelectedKeys, kept_by};
pub use selector_cache::{CachedSelector, SelectorCache};

/// The `policy-repo` module.
pub fn cell() -> Module {
    Module::new(
        "policy-repo",
        "Translates network policies into rules and resolves each endpoint's allowed peers",
    )
    .config::<PolicyConfig>()
    .provide(PolicyRepository::new)
    .contribute(PolicyService::api)
}
