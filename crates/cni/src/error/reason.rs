//! How the agent's typed refusals become CNI codes and advice: one row per
//! `cellium.v1.Reason`, the table in `docs/cni.md`. Refusals without a reason (from tonic
//! itself, or an agent of another release) fall back to their gRPC code ([`super::grpc`]).

use cellium_api::Reason;

use super::{
    AGENT_INTERNAL, AGENT_INVALID_REQUEST, AGENT_NOT_FOUND, ALREADY_EXISTS, CHECK_FAILED,
    RESOURCES_EXHAUSTED, TRY_AGAIN_LATER,
};

/// One row of the table: the CNI code, a name for the message, and what to do.
pub(super) struct Row {
    pub(super) code: u32,
    pub(super) name: &'static str,
    pub(super) hint: &'static str,
}

const SEE_LOG: &str = "see the agent's log (`cellium status` shows its health)";
const RECREATE: &str = "re-create the pod (DEL then ADD)";

/// The row of `reason`.
pub(super) fn row(reason: Reason) -> Row {
    let (code, name, hint) = match reason {
        Reason::InvalidRequest => (
            AGENT_INVALID_REQUEST,
            "invalid request",
            "fix the value it names in CNI_ARGS or in the network configuration",
        ),
        Reason::AddressOutsidePools => (
            AGENT_INVALID_REQUEST,
            "address outside the pod CIDRs",
            "request an address inside the node's pod CIDRs (IP= in CNI_ARGS, or the ips capability) that is not a pool's network, broadcast or router address",
        ),
        Reason::NoPool => (
            AGENT_INVALID_REQUEST,
            "no pod CIDR of that family",
            "request an address of a family the node has a pod CIDR of, or give the node one (the agent's pod-cidr)",
        ),
        Reason::NetnsNotPassed => (
            AGENT_INVALID_REQUEST,
            "network namespace not passed",
            "the caller must pass the namespace itself with the call: install the agent and cellium-cni from the same release",
        ),
        Reason::NetnsRefused => (
            AGENT_INVALID_REQUEST,
            "network namespace refused",
            "CNI_NETNS must name the pod's own network namespace, never the node's",
        ),
        Reason::PoolExhausted => (
            RESOURCES_EXHAUSTED,
            "address pool exhausted",
            "delete unused pods or give the node a larger pod CIDR",
        ),
        Reason::EndpointIdsExhausted => (
            RESOURCES_EXHAUSTED,
            "endpoint ids exhausted",
            "the node has as many endpoints as it can number: delete unused pods",
        ),
        Reason::IdentitiesExhausted => (
            RESOURCES_EXHAUSTED,
            "security identities exhausted",
            "every identity number is in use: fewer distinct label sets are needed (`cellium identity list`)",
        ),
        Reason::AddressInUse => (
            ALREADY_EXISTS,
            "address in use",
            "request another address (IP= in CNI_ARGS, or the ips capability), or delete the pod that holds it",
        ),
        Reason::InterfaceExists => (
            ALREADY_EXISTS,
            "interface name taken",
            "free the interface name in the pod's network namespace, or pass another CNI_IFNAME",
        ),
        Reason::AttachmentExists => (
            ALREADY_EXISTS,
            "attachment exists",
            "DEL the container's existing attachment first",
        ),
        Reason::AddressQuarantined => (
            TRY_AGAIN_LATER,
            "address held back",
            "the address was released recently and is held back for a while; the runtime should retry later, or request another address",
        ),
        Reason::NotReady => (
            TRY_AGAIN_LATER,
            "agent not ready",
            "the agent is starting or its datapath is not loaded (check `cellium status`); the runtime should retry later",
        ),
        Reason::PodUnknown => (
            TRY_AGAIN_LATER,
            "pod unknown",
            "the agent could not learn the pod's labels from the Kubernetes API server (see the message and `cellium status`); the runtime should retry later",
        ),
        Reason::NetnsMissing => (
            AGENT_NOT_FOUND,
            "network namespace missing",
            "CNI_NETNS must name the pod's existing network namespace",
        ),
        Reason::EndpointNotFound => (AGENT_NOT_FOUND, "no such endpoint", RECREATE),
        Reason::AttachmentDiffers => (CHECK_FAILED, "attachment differs", RECREATE),
        Reason::IdentityStoreFailed => (
            AGENT_INTERNAL,
            "identity store failed",
            "the agent cannot read or write its identity table: see its log and check its state directory's disk",
        ),
        Reason::StateWriteFailed => (
            AGENT_INTERNAL,
            "state write failed",
            "the agent cannot write its state directory (a full or read-only disk?): see its log",
        ),
        Reason::InterfaceSetupFailed => (AGENT_INTERNAL, "interface set-up failed", SEE_LOG),
        Reason::DatapathFailed => (AGENT_INTERNAL, "datapath failed", SEE_LOG),
        Reason::TeardownIncomplete => (
            AGENT_INTERNAL,
            "removal incomplete",
            "the endpoint keeps its record and addresses: retry DEL once the cause in the agent's log is fixed",
        ),
        Reason::Internal | Reason::Unspecified => (AGENT_INTERNAL, "agent internal error", SEE_LOG),
    };
    Row { code, name, hint }
}

#[cfg(test)]
mod tests {
    use super::super::Error;
    use super::*;

    #[test]
    fn reasons_map_to_the_documented_cni_codes() {
        let table = [
            (Reason::InvalidRequest, 101),
            (Reason::AddressOutsidePools, 101),
            (Reason::NoPool, 101),
            (Reason::NetnsNotPassed, 101),
            (Reason::NetnsRefused, 101),
            (Reason::NetnsMissing, 102),
            (Reason::EndpointNotFound, 102),
            (Reason::PoolExhausted, 103),
            (Reason::EndpointIdsExhausted, 103),
            (Reason::IdentitiesExhausted, 103),
            (Reason::AddressInUse, 104),
            (Reason::InterfaceExists, 104),
            (Reason::AttachmentExists, 104),
            (Reason::AttachmentDiffers, 105),
            (Reason::AddressQuarantined, 11),
            (Reason::NotReady, 11),
            (Reason::PodUnknown, 11),
            (Reason::IdentityStoreFailed, 100),
            (Reason::StateWriteFailed, 100),
            (Reason::InterfaceSetupFailed, 100),
            (Reason::DatapathFailed, 100),
            (Reason::TeardownIncomplete, 100),
            (Reason::Internal, 100),
        ];
        assert_eq!(table.len(), 23, "every reason is in the table");
        for (reason, cni) in table {
            // The reason decides, whatever gRPC code came with it.
            let e = Error::Agent {
                call: "Endpoints.Create",
                grpc: tonic::Code::Internal,
                reason: Some(reason),
                message: "m".into(),
            };
            assert_eq!(e.code(), cni, "{reason:?}");
        }
    }

    #[test]
    fn only_the_pool_is_called_the_pool() {
        let identities = Error::Agent {
            call: "Endpoints.Create",
            grpc: tonic::Code::ResourceExhausted,
            reason: Some(Reason::IdentitiesExhausted),
            message: "all 65280 cluster identities are in use".into(),
        };
        let msg = identities.to_string();
        assert!(!msg.contains("pool"), "{msg}");
        assert!(msg.contains("identities exhausted"), "{msg}");
        // And a refusal tonic made itself (a message over the size limit) is not either.
        let too_big = Error::Agent {
            call: "Endpoints.Gc",
            grpc: tonic::Code::ResourceExhausted,
            reason: None,
            message: "decoded message length too large".into(),
        };
        assert!(!too_big.to_string().contains("pool"), "{too_big}");
        assert_eq!(too_big.code(), 103);
    }
}
