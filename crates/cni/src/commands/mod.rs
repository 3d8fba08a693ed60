//! One file per CNI verb. Each `exec` parses what its verb needs, talks to the agent and returns
//! a [`Reply`]; `main.rs` prints it, or the error.

pub mod add;
pub mod check;
pub mod del;
pub mod gc;
pub mod status;
pub mod version;

use serde_json::Value;

use crate::args::CniArgs;
use crate::config::NetConf;
use crate::env::{Attachment, Env};
use crate::error::Result;
use crate::version::Verb;

/// What a successful verb produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The JSON to print on stdout: ADD's result, VERSION's versions; `None` for the verbs the
    /// spec wants silent on success.
    pub stdout: Option<Value>,
    /// One line for the call log, e.g. `endpoint 7: 10.0.0.5/32`.
    pub summary: String,
}

/// The inputs of an attachment verb (ADD, CHECK), validated in the reference library's order:
/// environment (code 4), configuration (6, 7, 1), then CNI_ARGS (4, 2).
#[derive(Debug, Clone)]
pub struct Request {
    /// Which attachment.
    pub attachment: Attachment,
    /// The network configuration.
    pub conf: NetConf,
    /// CNI_ARGS.
    pub args: CniArgs,
}

impl Request {
    /// Parses the inputs of `verb`.
    pub fn parse(env: &Env, stdin: &[u8], verb: Verb) -> Result<Request> {
        let attachment = env.attachment(verb)?;
        let conf = NetConf::parse(stdin, verb)?;
        let args = CniArgs::parse(env.args.as_deref())?;
        Ok(Request {
            attachment,
            conf,
            args,
        })
    }
}
