//! The policy model: what an endpoint's policy is once resolved, and how the datapath
//! decides over it. No I/O and no BPF: the policy repository, the datapath crate and tests
//! share these types and this one decision.
//!
//! - [`Direction`], [`Protocol`], [`Verdict`]: the vocabulary.
//! - [`PolicyRule`]: one rule of an endpoint's resolved policy (a peer identity, 0 for
//!   every peer; a protocol; a port range; allow or deny).
//! - [`compile`]: rules to [`PolicyEntry`]s whose longest-prefix match gives the rules'
//!   meaning (a deny wins over any allow), what the datapath's `cel_policy` map holds.
//! - [`decide`]: the datapath's [`Decision`] over such entries for a new connection (two
//!   longest-prefix lookups, the peer's identity and identity 0; a deny from either wins).
//!
//! Where to start: `docs/datapath.md`, "Policy".
//!
//! ```
//! use cellium_policy::{Decision, Direction, PolicyRule, Protocol, Verdict, compile, decide};
//!
//! let rules = [
//!     PolicyRule { identity: 300, direction: Direction::Ingress, protocol: Some(Protocol::Tcp),
//!                  ports: None, verdict: Verdict::Deny },
//!     PolicyRule { identity: 300, direction: Direction::Ingress, protocol: Some(Protocol::Tcp),
//!                  ports: Some(80..=90), verdict: Verdict::Allow },
//!     PolicyRule { identity: 0, direction: Direction::Ingress, protocol: None,
//!                  ports: Some(443..=443), verdict: Verdict::Allow },
//! ];
//! let entries = compile(7, &rules)?;
//! // The broader deny of identity 300 wins over its narrower allow.
//! assert_eq!(decide(&entries, Direction::Ingress, 300, Protocol::Tcp, 85), Decision::Denied);
//! assert_eq!(decide(&entries, Direction::Ingress, 301, Protocol::Udp, 443), Decision::Allowed);
//! assert_eq!(decide(&entries, Direction::Ingress, 301, Protocol::Tcp, 80), Decision::NoMatch);
//! # Ok::<(), cellium_policy::Error>(())
//! ```

mod compile;
mod decide;
mod entry;
mod error;
mod types;

pub use compile::{PolicyRule, compile};
pub use decide::{Decision, decide, longest_match};
pub use entry::{L4Match, PolicyEntry, block_mask};
pub use error::{Error, Result};
pub use types::{Direction, Protocol, Verdict};
