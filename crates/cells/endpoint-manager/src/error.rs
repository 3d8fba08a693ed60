//! Errors of the endpoint manager, each naming the endpoint and the input at fault.

use std::path::PathBuf;

/// Why an endpoint operation failed. Every failure of `create` leaves nothing behind.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The request field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The pod's network namespace does not exist.
    #[error("network namespace {0} does not exist")]
    NetnsMissing(PathBuf),
    /// No endpoint matches.
    #[error("no endpoint {0}")]
    NotFound(String),
    /// The attachment (container id, interface) already has an endpoint, and the request is
    /// not a retry of the one that made it: it names another network namespace or addresses
    /// the endpoint does not hold.
    #[error(
        "container {container_id} interface {ifname} already has endpoint {id} in {netns} with {addresses}; this request names {requested}: delete that attachment first"
    )]
    AttachmentExists {
        /// The runtime's container id.
        container_id: String,
        /// The interface.
        ifname: String,
        /// The existing endpoint.
        id: u16,
        /// Its network namespace.
        netns: PathBuf,
        /// Its addresses.
        addresses: String,
        /// What the request asked for (network namespace and addresses).
        requested: String,
    },
    /// Every endpoint id is taken.
    #[error("no endpoint id left: all {0} are in use")]
    IdsExhausted(usize),
    /// Address allocation failed.
    #[error("cannot allocate an address for {owner}")]
    Ipam {
        /// Who asked.
        owner: String,
        /// Why.
        #[source]
        source: cellium_ipam::Error,
    },
    /// No identity could be given to the endpoint's labels.
    #[error("identity of endpoint {endpoint}")]
    Identity {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: cellium_identity::Error,
    },
    /// Setting up or checking the interfaces failed.
    #[error("interfaces of endpoint {endpoint}")]
    Plumbing {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: crate::plumbing::Error,
    },
    /// The datapath could not be programmed for the endpoint.
    #[error("datapath of endpoint {endpoint}")]
    Datapath {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: cellium_datapath_bpf::Error,
    },
    /// The datapath is not loaded.
    #[error(transparent)]
    Loader(#[from] cellium_loader::Error),
    /// The endpoint record could not be written or read.
    #[error("state of endpoint {endpoint}")]
    State {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: cellium_statedir::Error,
    },
    /// The agent has not finished starting (restoring endpoints).
    #[error("the endpoint manager is not started yet")]
    NotStarted,
    /// Taking an endpoint down left some of it in place. It stays recorded, with its
    /// addresses, and a retried DEL (or the next restore) finishes the job.
    #[error(
        "{endpoint} is not fully removed ({}); it keeps its record and addresses until a DEL or the next restart finishes it",
        .failures.join("; ")
    )]
    Teardown {
        /// The endpoint.
        endpoint: String,
        /// Each step that failed or was held back, with why (`datapath: ...`).
        failures: Vec<String>,
    },
    /// Restored endpoints hold addresses that the configured pod CIDRs no longer cover; the
    /// agent does not start rather than cut their pods off.
    #[error(
        "restored endpoints hold addresses outside the configured pod CIDRs ({cidrs}): {}; their pods keep their interfaces. Configure pod-cidr to cover them, or set remove-endpoints-outside-pod-cidr to remove them",
        .endpoints.join(", ")
    )]
    OutsidePodCidr {
        /// Each endpoint with the addresses at fault (`endpoint 3 (default/web) at 10.244.0.5`).
        endpoints: Vec<String>,
        /// The pod CIDRs now configured.
        cidrs: String,
    },
}

/// An error with its sources, as one line: `a: b: c`.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
