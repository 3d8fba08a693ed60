//! Security labels and label selectors, with Cilium's semantics. No I/O.
//!
//! - [`Label`]: `source:key=value` (`k8s:app=web`, `reserved:host`, `cidr:10.0.0.0/8`);
//!   the sources are in [`source`].
//! - [`Labels`]: a canonical sorted set, the stuff security identities are made of;
//!   [`Labels::for_pod`] derives a pod's security-relevant labels as Cilium does, and
//!   [`Labels::for_cidr`] those of an IP prefix.
//! - [`Selector`]: a Kubernetes label selector (`matchLabels`, `matchExpressions`) with
//!   Cilium's key sources (`k8s:app`, `any:app`, `reserved:host`, prefix-aware `cidr:` keys),
//!   a canonical text for cache keys, and constructors policies need
//!   ([`Selector::namespace`], [`Selector::all`], [`Selector::cidr`], [`Selector::and`]).
//!
//! IPv6 prefixes in `cidr:` labels are written with `-` for `:` (`cidr:fd00--0/64`), as
//! Cilium writes them, so that the first `:` of a label always ends its source.

mod cidr;
mod error;
mod filter;
mod label;
mod labels;
mod selector;

pub use error::{Error, Result};
pub use filter::is_relevant as is_relevant_pod_label;
pub use label::{Label, source};
pub use labels::{
    Labels, NAMESPACE_LABELS_PREFIX, POD_NAMESPACE_LABEL, POLICY_CLUSTER_LABEL,
    POLICY_SERVICE_ACCOUNT_LABEL,
};
pub use selector::{Key, Operator, Requirement, Selector};
