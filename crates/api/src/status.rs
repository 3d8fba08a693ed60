//! What cells tell the `Agent.Status` call besides their health: notes for the operator, and
//! which modules keep running pods' datapath current.

use std::collections::BTreeSet;
use std::fmt;

type NoteFn = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// A condition an operator must know that is not a fault, e.g. "every endpoint is locked down: ...".
///
/// A cell `contribute`s an `Arc<StatusNote>`; the `api-server` cell collects every one
/// (`Vec<Arc<StatusNote>>`), asks each on every `Agent.Status` call, and lists the sentences
/// they return in `StatusResponse.notes` (`cellium status` prints them under the health
/// summary). A note returns `None` while its condition does not hold.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use cellium_api::StatusNote;
///
/// let locked = Arc::new(AtomicBool::new(true));
/// let seen = locked.clone();
/// let note = StatusNote::new(move || {
///     seen.load(Ordering::Relaxed)
///         .then(|| "every endpoint is locked down: a recorded policy does not load".to_string())
/// });
/// assert!(note.text().is_some());
/// locked.store(false, Ordering::Relaxed);
/// assert_eq!(note.text(), None);
/// ```
pub struct StatusNote {
    text: NoteFn,
}

impl StatusNote {
    /// A note whose text `text` computes when asked. Trap: it runs on every status call, on the
    /// API's threads: it must be quick and must not block.
    pub fn new(text: impl Fn() -> Option<String> + Send + Sync + 'static) -> StatusNote {
        StatusNote {
            text: Box::new(text),
        }
    }

    /// The note's sentence now, or `None` while its condition does not hold.
    pub fn text(&self) -> Option<String> {
        (self.text)()
    }
}

impl fmt::Debug for StatusNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusNote").finish_non_exhaustive()
    }
}

/// The modules that keep running pods' datapath current: they program the BPF maps and programs
/// every packet of a running pod meets (endpoints, policy, identities, services). When one of
/// them is not OK, running pods may have limited connectivity (CNI STATUS code 51); when only
/// others are, new pods cannot be set up but running ones are unaffected (code 50).
///
/// The agent binary declares this once, where it composes its cells, and provides it to the
/// `api-server` cell, which judges the health tree with it without depending on those cells.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DatapathModules {
    ids: BTreeSet<&'static str>,
}

impl DatapathModules {
    /// The modules with these ids (module ids, as `Module::id` gives them).
    pub fn new(ids: impl IntoIterator<Item = &'static str>) -> DatapathModules {
        DatapathModules {
            ids: ids.into_iter().collect(),
        }
    }

    /// Whether the health node `node_id` (a dotted path such as `endpoint-manager.regenerate`)
    /// lies in one of the modules: one of its segments is a module id.
    pub fn contains_node(&self, node_id: &str) -> bool {
        node_id.split('.').any(|segment| self.ids.contains(segment))
    }

    /// The module ids.
    pub fn ids(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.ids.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_belongs_to_a_module_by_any_segment_of_its_path() {
        let modules = DatapathModules::new(["loader", "policy-repo"]);
        assert!(modules.contains_node("loader"));
        assert!(modules.contains_node("agent.datapath.loader.attach"));
        assert!(modules.contains_node("policy-repo.recompute"));
        assert!(!modules.contains_node("ipam.restore"));
        assert!(!modules.contains_node("loaders"));
    }
}
