//! The typed reason of a refusal: how the agent attaches it to a gRPC status and how a client
//! reads it back (`proto/cellium/v1/reason.proto`).

use std::collections::HashMap;

use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

use crate::v1::Reason;

/// The `domain` of the `google.rpc.ErrorInfo` that carries a [`Reason`].
pub const DOMAIN: &str = "cellium.io";

impl Reason {
    /// The gRPC status code a refusal with this reason has (the one `reason.proto` names), so a
    /// client that does not know the reason still acts rightly on the code.
    pub fn code(self) -> Code {
        match self {
            Reason::InvalidRequest
            | Reason::AddressOutsidePools
            | Reason::NetnsNotPassed
            | Reason::NetnsRefused => Code::InvalidArgument,
            Reason::NoPool | Reason::AttachmentDiffers => Code::FailedPrecondition,
            Reason::PoolExhausted | Reason::EndpointIdsExhausted | Reason::IdentitiesExhausted => {
                Code::ResourceExhausted
            }
            Reason::AddressInUse | Reason::InterfaceExists | Reason::AttachmentExists => {
                Code::AlreadyExists
            }
            Reason::AddressQuarantined | Reason::NotReady | Reason::PodUnknown => Code::Unavailable,
            Reason::NetnsMissing | Reason::EndpointNotFound => Code::NotFound,
            Reason::IdentityStoreFailed
            | Reason::StateWriteFailed
            | Reason::InterfaceSetupFailed
            | Reason::DatapathFailed
            | Reason::TeardownIncomplete
            | Reason::Internal
            | Reason::Unspecified => Code::Internal,
        }
    }
}

/// A refusal: the reason's gRPC code, `message`, and the reason in the status details.
pub fn refusal(reason: Reason, message: impl Into<String>) -> tonic::Status {
    tonic::Status::with_error_details(
        reason.code(),
        message,
        ErrorDetails::with_error_info(reason.as_str_name(), DOMAIN, HashMap::new()),
    )
}

/// The reason a refusal carries; `None` when it carries none (a status tonic made itself, an
/// older agent) or one this client does not know (a newer agent).
pub fn reason_of(status: &tonic::Status) -> Option<Reason> {
    let info = status.get_details_error_info()?;
    if info.domain != DOMAIN {
        return None;
    }
    Reason::from_str_name(&info.reason).filter(|r| *r != Reason::Unspecified)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_code_and_is_read_back() {
        for value in 1..=21 {
            let reason = Reason::try_from(value).unwrap();
            let status = refusal(reason, "why");
            assert_eq!(status.code(), reason.code());
            assert_eq!(status.message(), "why");
            assert_eq!(reason_of(&status), Some(reason), "{reason:?}");
        }
    }

    #[test]
    fn a_status_without_a_reason_has_none() {
        assert_eq!(
            reason_of(&tonic::Status::resource_exhausted("too big")),
            None
        );
        let foreign = tonic::Status::with_error_details(
            Code::Internal,
            "x",
            ErrorDetails::with_error_info("REASON_POOL_EXHAUSTED", "example.com", HashMap::new()),
        );
        assert_eq!(reason_of(&foreign), None);
    }
}
