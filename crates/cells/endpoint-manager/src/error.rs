//! Errors of the endpoint manager, each naming the endpoint and the input at fault, and the
//! typed reason each gives the API's callers ([`Error::reason`]).

use std::path::PathBuf;

use cellium_api::Reason;

use crate::plumbing;
pub(crate) use cellium_hive::error_chain as chain;

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
    /// The request names the pod's network namespace, but the caller did not pass the namespace
    /// itself with the call (an open descriptor), and the path alone may be one the agent cannot
    /// see or that names another namespace here.
    #[error(
        "network namespace {0} was named but not passed: the caller must open it and pass the descriptor with the call (cellium-cni does; API clients use cellium_api::connect_with_netns)"
    )]
    NetnsNotPassed(PathBuf),
    /// The network namespace passed cannot be used for a pod.
    #[error("the network namespace of container {container_id}")]
    Netns {
        /// The runtime's container id.
        container_id: String,
        /// Why.
        #[source]
        source: plumbing::Error,
    },
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
    #[error("identity of {endpoint}")]
    Identity {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: cellium_identity::Error,
    },
    /// Setting up or checking the interfaces failed.
    #[error("interfaces of {endpoint}")]
    Plumbing {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: crate::plumbing::Error,
    },
    /// The datapath could not be programmed for the endpoint.
    #[error("datapath of {endpoint}")]
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
    #[error("state of {endpoint}")]
    State {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: cellium_statedir::Error,
    },
    /// Kubernetes mode: the pod the request names is not known (see
    /// [`cellium_resources::Resources::pod_for_add`]).
    #[error("cannot learn the pod's labels")]
    PodUnknown(#[source] cellium_resources::Error),
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
    /// GC could not delete some of the stale endpoints (it deleted the others).
    #[error(
        "GC removed endpoints {removed:?} but not all: {}",
        .failures.join("; ")
    )]
    Gc {
        /// The endpoints it removed.
        removed: Vec<u16>,
        /// Each endpoint it could not delete, with why.
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

impl Error {
    /// The reason the API gives its caller (`proto/cellium/v1/reason.proto`). Every variant, and
    /// every variant of the errors it wraps, chooses one here.
    pub fn reason(&self) -> Reason {
        match self {
            Error::Invalid { .. } => Reason::InvalidRequest,
            Error::NetnsNotPassed(_) => Reason::NetnsNotPassed,
            Error::Netns { source, .. } | Error::Plumbing { source, .. } => plumbing_reason(source),
            Error::NotFound(_) => Reason::EndpointNotFound,
            Error::AttachmentExists { .. } => Reason::AttachmentExists,
            Error::IdsExhausted(_) => Reason::EndpointIdsExhausted,
            Error::Ipam { source, .. } => ipam_reason(source),
            Error::Identity { source, .. } => identity_reason(source),
            Error::Datapath { .. } => Reason::DatapathFailed,
            Error::Loader(_) | Error::NotStarted => Reason::NotReady,
            Error::PodUnknown(_) => Reason::PodUnknown,
            Error::State { .. } => Reason::StateWriteFailed,
            Error::Teardown { .. } | Error::Gc { .. } => Reason::TeardownIncomplete,
            // Only ever a start failure, never an answer to a request.
            Error::OutsidePodCidr { .. } => Reason::Internal,
        }
    }
}

fn plumbing_reason(e: &plumbing::Error) -> Reason {
    use plumbing::Error as P;
    match e {
        P::NetnsRefused { .. } => Reason::NetnsRefused,
        P::LinkExists { .. } => Reason::InterfaceExists,
        P::LinkMissing { .. } | P::Drift(_) => Reason::AttachmentDiffers,
        P::Netns { .. } | P::Netlink { .. } | P::Sysctl { .. } | P::Thread { .. } => {
            Reason::InterfaceSetupFailed
        }
    }
}

fn ipam_reason(e: &cellium_ipam::Error) -> Reason {
    use cellium_ipam::Error as I;
    match e {
        I::Exhausted { .. } => Reason::PoolExhausted,
        I::InUse { .. } => Reason::AddressInUse,
        I::NotInPool { .. } | I::Reserved { .. } => Reason::AddressOutsidePools,
        I::NoPool { .. } => Reason::NoPool,
        I::Quarantined { .. } => Reason::AddressQuarantined,
        I::DuplicateRequest { .. } => Reason::InvalidRequest,
        I::Record { .. } => Reason::StateWriteFailed,
        // Configuration errors of the pools themselves; a request cannot cause them.
        I::PoolTooSmall { .. }
        | I::Overlap { .. }
        | I::PodCidr { .. }
        | I::Unusable { .. }
        | I::NotKubernetes => Reason::Internal,
    }
}

fn identity_reason(e: &cellium_identity::Error) -> Reason {
    use cellium_identity::Error as I;
    match e {
        I::Exhausted { .. } => Reason::IdentitiesExhausted,
        I::State { .. } | I::Decode { .. } | I::Held { .. } => Reason::IdentityStoreFailed,
        // The endpoint's labels are the agent's making, not the caller's.
        I::NoLabels | I::UnknownReserved { .. } | I::Mode(_) => Reason::Internal,
        // The cluster's store did not answer (yet): the runtime retries.
        I::Unnumbered { .. } => Reason::NotReady,
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_their_cause_not_their_grpc_code() {
        let exhausted = Error::Ipam {
            owner: "endpoint 1".into(),
            source: cellium_ipam::Error::Exhausted {
                cidr: "10.0.0.0/30".parse().unwrap(),
                capacity: 1,
                quarantined: 0,
            },
        };
        assert_eq!(exhausted.reason(), Reason::PoolExhausted);
        let quarantined = Error::Ipam {
            owner: "endpoint 1".into(),
            source: cellium_ipam::Error::Quarantined {
                ip: "10.0.0.2".parse().unwrap(),
                released: None,
                until: std::time::SystemTime::now(),
            },
        };
        assert_eq!(quarantined.reason(), Reason::AddressQuarantined);
        let identities = Error::Identity {
            endpoint: "endpoint 1".into(),
            source: cellium_identity::Error::NoLabels,
        };
        assert_eq!(identities.reason(), Reason::Internal);
        // Both were RESOURCE_EXHAUSTED once; the reasons tell them apart.
        assert_eq!(
            Error::IdsExhausted(65535).reason(),
            Reason::EndpointIdsExhausted
        );
        let refused = Error::Netns {
            container_id: "c1".into(),
            source: plumbing::Error::NetnsRefused {
                path: "/proc/self/ns/net".into(),
                why: plumbing::Refusal::AgentOwn,
            },
        };
        assert_eq!(refused.reason(), Reason::NetnsRefused);
        assert_eq!(
            Error::NetnsNotPassed("/run/netns/x".into()).reason(),
            Reason::NetnsNotPassed
        );
        assert_eq!(Error::NotStarted.reason(), Reason::NotReady);
        let drift = Error::Plumbing {
            endpoint: "endpoint 1".into(),
            source: plumbing::Error::Drift("eth0 is down".into()),
        };
        assert_eq!(drift.reason(), Reason::AttachmentDiffers);
    }
}
