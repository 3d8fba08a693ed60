//! The crate's one error type; every variant maps onto a Kubernetes `Status`.

use serde_json::{Value, json};

/// What went wrong serving a request or changing the store.
///
/// Each variant carries what the API server puts into the `Status` it answers with
/// ([`Error::status`]), so direct store calls and HTTP requests fail the same way.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object (or its namespace) does not exist.
    #[error("{kind} \"{name}\" not found")]
    NotFound {
        /// Resource name as Kubernetes reports it (`pods`, `namespaces`).
        kind: String,
        /// Object name.
        name: String,
    },
    /// A create found an object of that name.
    #[error("{kind} \"{name}\" already exists")]
    AlreadyExists {
        /// Resource name (`pods`).
        kind: String,
        /// Object name.
        name: String,
    },
    /// An update carried a `metadata.resourceVersion` that is not the stored one.
    #[error(
        "Operation cannot be fulfilled on {kind} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
    )]
    Conflict {
        /// Resource name (`pods`).
        kind: String,
        /// Object name.
        name: String,
    },
    /// The request or the object is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The object is well-formed but not acceptable (missing name, wrong kind).
    #[error("{0}")]
    Invalid(String),
    /// No registered kind matches (`apiVersion`/`kind` or the URL's resource).
    #[error("the server could not find the requested resource: {0}")]
    UnknownKind(String),
    /// The verb is not allowed on that path.
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    /// A watch or continue token asked for a resourceVersion older than the history kept.
    #[error("too old resource version: {requested} ({oldest})")]
    Expired {
        /// The resourceVersion asked for.
        requested: u64,
        /// The oldest one still known.
        oldest: u64,
    },
    /// A fault injected with `ApiServer::fail_requests`.
    #[error("injected failure with status {0}")]
    Injected(u16),
    /// YAML or JSON that does not parse.
    #[error("cannot decode the document: {0}")]
    Decode(String),
    /// With RBAC on, a bearer token the server did not issue.
    #[error("Unauthorized")]
    Unauthorized,
    /// With RBAC on, no rule bound to the user allows the request (the message names both).
    #[error("{0}")]
    Forbidden(String),
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The HTTP status code the API server answers with.
    pub fn code(&self) -> u16 {
        match self {
            Error::NotFound { .. } | Error::UnknownKind(_) => 404,
            Error::AlreadyExists { .. } | Error::Conflict { .. } => 409,
            Error::BadRequest(_) | Error::Decode(_) => 400,
            Error::Invalid(_) => 422,
            Error::MethodNotAllowed => 405,
            Error::Expired { .. } => 410,
            Error::Injected(code) => *code,
            Error::Unauthorized => 401,
            Error::Forbidden(_) => 403,
        }
    }

    /// The `reason` field of the `Status`, as Kubernetes spells it.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NotFound { .. } | Error::UnknownKind(_) => "NotFound",
            Error::AlreadyExists { .. } => "AlreadyExists",
            Error::Conflict { .. } => "Conflict",
            Error::BadRequest(_) | Error::Decode(_) => "BadRequest",
            Error::Invalid(_) => "Invalid",
            Error::MethodNotAllowed => "MethodNotAllowed",
            Error::Expired { .. } => "Expired",
            Error::Injected(code) => injected_reason(*code),
            Error::Unauthorized => "Unauthorized",
            Error::Forbidden(_) => "Forbidden",
        }
    }

    /// The `meta/v1` `Status` object describing this error.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        match self {
            Error::NotFound { kind, name }
            | Error::AlreadyExists { kind, name }
            | Error::Conflict { kind, name } => {
                let (group, kind) = match kind.split_once('.') {
                    Some((k, g)) => (g, k),
                    None => ("", kind.as_str()),
                };
                status["details"] = json!({ "name": name, "group": group, "kind": kind });
            }
            _ => {}
        }
        status
    }
}

fn injected_reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_status_names_the_object() {
        let status = Error::NotFound {
            kind: "pods".into(),
            name: "web".into(),
        }
        .status();
        assert_eq!(status["code"], 404);
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["details"]["name"], "web");
        assert_eq!(status["details"]["kind"], "pods");
        assert_eq!(status["message"], "pods \"web\" not found");
    }

    #[test]
    fn grouped_kind_splits_into_group() {
        let status = Error::AlreadyExists {
            kind: "leases.coordination.k8s.io".into(),
            name: "l".into(),
        }
        .status();
        assert_eq!(status["details"]["group"], "coordination.k8s.io");
        assert_eq!(status["details"]["kind"], "leases");
        assert_eq!(status["code"], 409);
    }
}
