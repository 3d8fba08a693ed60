//! How the agent's gRPC status codes become CNI codes and messages when a refusal carries no
//! reason the plugin knows (the second table in `docs/cni.md`): statuses tonic makes itself (a
//! message over the size limit, a deadline) and agents of other releases.

use super::{
    AGENT_INTERNAL, AGENT_INVALID_REQUEST, AGENT_NOT_FOUND, ALREADY_EXISTS, CHECK_FAILED,
    PERMISSION_DENIED, RESOURCES_EXHAUSTED, TRY_AGAIN_LATER, UNIMPLEMENTED,
};

/// The CNI code for a gRPC status code returned by the agent without a reason.
pub fn grpc_code(code: tonic::Code) -> u32 {
    use tonic::Code as G;
    match code {
        // Transient: the agent is starting, restarting or was interrupted.
        G::Unavailable | G::DeadlineExceeded | G::Aborted | G::Cancelled => TRY_AGAIN_LATER,
        G::InvalidArgument | G::OutOfRange => AGENT_INVALID_REQUEST,
        G::NotFound => AGENT_NOT_FOUND,
        G::ResourceExhausted => RESOURCES_EXHAUSTED,
        G::AlreadyExists => ALREADY_EXISTS,
        G::FailedPrecondition => CHECK_FAILED,
        G::PermissionDenied | G::Unauthenticated => PERMISSION_DENIED,
        G::Unimplemented => UNIMPLEMENTED,
        G::Ok | G::Unknown | G::Internal | G::DataLoss => AGENT_INTERNAL,
    }
}

pub(super) fn grpc_name(code: tonic::Code) -> &'static str {
    use tonic::Code as G;
    match code {
        G::Ok => "ok",
        G::Cancelled => "cancelled",
        G::Unknown => "unknown error",
        G::InvalidArgument => "invalid argument",
        G::DeadlineExceeded => "deadline exceeded",
        G::NotFound => "not found",
        G::AlreadyExists => "already exists",
        G::PermissionDenied => "permission denied",
        G::ResourceExhausted => "resources exhausted",
        G::FailedPrecondition => "state differs",
        G::Aborted => "aborted",
        G::OutOfRange => "out of range",
        G::Unimplemented => "not implemented by the agent",
        G::Internal => "agent internal error",
        G::Unavailable => "agent unavailable",
        G::DataLoss => "data loss",
        G::Unauthenticated => "unauthenticated",
    }
}

/// What to do about a gRPC failure, for the call that returned it.
pub(super) fn grpc_hint(call: &str, code: tonic::Code) -> &'static str {
    use tonic::Code as G;
    match code {
        G::Unavailable | G::DeadlineExceeded | G::Aborted | G::Cancelled => {
            "the agent is not ready (check `cellium status`); the runtime should retry later"
        }
        G::InvalidArgument | G::OutOfRange => {
            "fix the value it names in CNI_ARGS or in the network configuration"
        }
        G::NotFound if call.ends_with("Create") => {
            "CNI_NETNS must name the pod's existing network namespace"
        }
        G::NotFound => "the agent has no such endpoint: re-create the pod (DEL then ADD)",
        G::ResourceExhausted => {
            "something the agent hands out is exhausted, or a message exceeded the API's 4 MiB limit; the message says which"
        }
        G::AlreadyExists => {
            "request another address (IP= in CNI_ARGS, or the ips capability), free the interface name in the pod's network namespace, or DEL the container's existing attachment first"
        }
        G::FailedPrecondition => "re-create the pod (DEL then ADD)",
        G::PermissionDenied | G::Unauthenticated => "run cellium-cni as root",
        G::Unimplemented => "install the agent and cellium-cni from the same release",
        G::Ok | G::Unknown | G::Internal | G::DataLoss => {
            "see the agent's log (`cellium status` shows its health)"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Error;

    #[test]
    fn grpc_codes_map_to_the_documented_cni_codes() {
        use tonic::Code as G;
        let table = [
            (G::Unavailable, 11),
            (G::DeadlineExceeded, 11),
            (G::Aborted, 11),
            (G::Cancelled, 11),
            (G::InvalidArgument, 101),
            (G::OutOfRange, 101),
            (G::NotFound, 102),
            (G::ResourceExhausted, 103),
            (G::AlreadyExists, 104),
            (G::FailedPrecondition, 105),
            (G::PermissionDenied, 106),
            (G::Unauthenticated, 106),
            (G::Unimplemented, 107),
            (G::Internal, 100),
            (G::Unknown, 100),
            (G::DataLoss, 100),
        ];
        for (grpc, cni) in table {
            let e = Error::Agent {
                call: "Endpoints.Create",
                grpc,
                reason: None,
                message: "m".into(),
            };
            assert_eq!(e.code(), cni, "{grpc:?}");
        }
    }
}
