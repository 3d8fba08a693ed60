//! Lockdown: the endpoints that policies not in force could have restricted enforce both
//! directions, allowing only what the policies in force allow them (and, for ingress, the
//! node). Only those: a gap's scope ([`GapScope`]) says which, so one tenant's policy that
//! this agent cannot enforce leaves every other tenant's pods under their own policies.

use cellium_labels::{Labels, Selector};
use cellium_resources::{GapScope, PolicyGap};

use crate::translate;

/// The gaps in force and the subjects they lock down.
#[derive(Debug, Default)]
pub(crate) struct Lockdown {
    gaps: Vec<PolicyGap>,
    /// Each gap's subjects, in the gaps' order.
    subjects: Vec<Vec<Selector>>,
}

impl Lockdown {
    pub(crate) fn new(gaps: Vec<PolicyGap>) -> Lockdown {
        let subjects = gaps.iter().map(|g| subjects(&g.scope)).collect();
        Lockdown { gaps, subjects }
    }

    pub(crate) fn gaps(&self) -> &[PolicyGap] {
        &self.gaps
    }

    /// Whether an endpoint with `labels` is locked down.
    pub(crate) fn covers(&self, labels: &Labels) -> bool {
        self.subjects.iter().flatten().any(|s| s.matches(labels))
    }

    /// The status line, when anything is locked down.
    pub(crate) fn describe(&self) -> Option<String> {
        if self.gaps.is_empty() {
            return None;
        }
        let each: Vec<String> = self
            .gaps
            .iter()
            .map(|g| format!("{} (locks down {})", g.text, g.scope))
            .collect();
        Some(format!(
            "endpoints locked down (default deny both ways, but for what the policies in force allow) until these objects are applied again, changed or deleted: {}",
            each.join(", ")
        ))
    }
}

/// The selectors of the endpoints `scope` covers. A Cilium selector that does not translate
/// (it was checked once already) widens to the policy's namespace, or to everything.
fn subjects(scope: &GapScope) -> Vec<Selector> {
    match scope {
        GapScope::Everything => vec![Selector::all()],
        GapScope::Namespace(ns) => vec![Selector::namespace(ns)],
        GapScope::Selected {
            namespace,
            selectors,
        } => {
            let within = |s: Selector| match namespace {
                Some(ns) => s.and(Selector::namespace(ns)),
                None => s,
            };
            let translated: Result<Vec<Selector>, String> = selectors
                .iter()
                .map(|s| translate::selector(s, str::to_string).map(within))
                .collect();
            translated.unwrap_or_else(|_| vec![within(Selector::all())])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellium_resources::LabelSelector;

    fn pod(ns: &str, app: &str) -> Labels {
        Labels::for_pod(
            ns,
            &[("app".to_string(), app.to_string())].into_iter().collect(),
            &Default::default(),
        )
    }

    fn gap(scope: GapScope) -> PolicyGap {
        PolicyGap {
            text: "CiliumNetworkPolicy shop/p: egress[0].toFQDNs: not supported".into(),
            scope,
        }
    }

    #[test]
    fn a_gap_locks_down_only_what_its_policy_could_have_selected() {
        let db = LabelSelector {
            match_labels: [("app".to_string(), "db".to_string())].into(),
            ..Default::default()
        };
        let selected = Lockdown::new(vec![gap(GapScope::Selected {
            namespace: Some("shop".into()),
            selectors: vec![db.clone()],
        })]);
        assert!(selected.covers(&pod("shop", "db")));
        assert!(!selected.covers(&pod("shop", "web")));
        assert!(!selected.covers(&pod("dev", "db")), "another namespace");
        let clusterwide = Lockdown::new(vec![gap(GapScope::Selected {
            namespace: None,
            selectors: vec![db],
        })]);
        assert!(clusterwide.covers(&pod("dev", "db")));
        assert!(!clusterwide.covers(&pod("dev", "web")));
        let namespace = Lockdown::new(vec![gap(GapScope::Namespace("shop".into()))]);
        assert!(namespace.covers(&pod("shop", "web")));
        assert!(!namespace.covers(&pod("dev", "web")));
        let everything = Lockdown::new(vec![gap(GapScope::Everything)]);
        assert!(everything.covers(&pod("dev", "web")));
        assert!(!Lockdown::default().covers(&pod("dev", "web")));
        let host = Lockdown::new(vec![gap(GapScope::Selected {
            namespace: None,
            selectors: Vec::new(),
        })]);
        assert!(
            !host.covers(&pod("dev", "web")),
            "a host policy selects no pod"
        );
        assert!(selected.describe().unwrap().contains("locked down"));
    }
}
