//! Authentication by bearer token and authorization by RBAC, decided as the real server's RBAC
//! authorizer decides, from the Roles, ClusterRoles and their bindings the store holds.
//!
//! It exists so that a test can prove that a component's RBAC rules (say, the ClusterRole of a
//! DaemonSet's ServiceAccount) cover every call the component makes: turn it on with
//! [`ApiServer::enable_rbac`](crate::ApiServer::enable_rbac), give the component a token of its
//! ServiceAccount ([`ApiServer::service_account_token`](crate::ApiServer::service_account_token)),
//! and every request it makes is authorized against the rules applied to the server, answered
//! `403 Forbidden` when no rule allows it, and recorded ([`ApiServer::audit`](crate::ApiServer::audit)).
//!
//! What it decides like the real authorizer: a request's verb (`get`, `list`, `watch`, `create`,
//! `update`, `patch`, `delete`, `deletecollection`), API group, resource, subresource
//! (`ciliumnodes/status`), namespace and name, against every rule of every role bound to the user
//! (by a ClusterRoleBinding anywhere, by a RoleBinding in the request's namespace), with `*`
//! wildcards in verbs, groups and resources, `resource/subresource` and `*/subresource`
//! entries, and `resourceNames` (a rule naming objects allows only requests for one of them).
//! Subjects are ServiceAccounts, Users and Groups (a ServiceAccount's user is
//! `system:serviceaccount:NS:NAME`, in the groups `system:serviceaccounts`,
//! `system:serviceaccounts:NS` and `system:authenticated`).
//!
//! A request without a token is the test's own and is allowed everything (as the store's direct
//! calls are), unless it impersonates a user (`Impersonate-User`, `kubectl --as=USER`; kubectl
//! sends no token over plain HTTP): then it is that user's. A token the server did not issue
//! is `401 Unauthorized`.
//!
//! What it does not:
//! discovery and other non-resource paths are allowed to every authenticated user (the real
//! server's `system:discovery` role); no aggregated ClusterRoles, no escalation checks on
//! writing RBAC objects, no impersonation.

use serde::Deserialize;
use serde_json::Value;

use crate::registry;
use crate::store::Store;

/// Who makes a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user name (`system:serviceaccount:kube-system:cellium`).
    pub name: String,
    /// The groups it belongs to.
    pub groups: Vec<String>,
}

impl User {
    /// The user called `name`, in the groups the real server gives it: a ServiceAccount's
    /// (`system:serviceaccount:NS:NAME`) or only `system:authenticated`.
    pub fn named(name: &str) -> User {
        let account = name
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'));
        match account {
            Some((namespace, account)) => User::service_account(namespace, account),
            None => User {
                name: name.to_string(),
                groups: vec!["system:authenticated".into()],
            },
        }
    }

    /// The user of ServiceAccount `namespace/name`.
    pub fn service_account(namespace: &str, name: &str) -> User {
        User {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }
}

/// What a resource request asks to do, as RBAC rules name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: &'static str,
    /// The API group, empty for core.
    pub group: String,
    /// The resource (`pods`).
    pub resource: String,
    /// The subresource (`status`), empty for the main resource.
    pub subresource: String,
    /// The namespace, empty for cluster-scoped requests.
    pub namespace: String,
    /// The object's name, empty for collections and creates.
    pub name: String,
}

impl Attributes {
    /// `resource` or `resource/subresource`, as rules and messages name it.
    pub fn resource_path(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// The message of the `403 Forbidden` the real server answers with.
    pub(crate) fn forbidden(&self, user: &User) -> String {
        let scope = if self.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{}\"", self.namespace)
        };
        let object = if self.name.is_empty() {
            self.resource.clone()
        } else {
            format!("{} \"{}\"", self.resource, self.name)
        };
        format!(
            "{object} is forbidden: User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            user.name,
            self.verb,
            self.resource_path(),
            self.group
        )
    }
}

/// One authorized or refused request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// The user's name.
    pub user: String,
    /// What it asked.
    pub attributes: Attributes,
    /// Whether a rule allowed it.
    pub allowed: bool,
}

/// A PolicyRule of a Role or ClusterRole.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Rule {
    verbs: Vec<String>,
    api_groups: Vec<String>,
    resources: Vec<String>,
    resource_names: Vec<String>,
}

impl Rule {
    fn allows(&self, a: &Attributes) -> bool {
        let any = |list: &[String], want: &str| list.iter().any(|v| v == "*" || v == want);
        let resource = if a.subresource.is_empty() {
            self.resources.iter().any(|r| r == "*" || *r == a.resource)
        } else {
            let wanted = a.resource_path();
            let any_sub = format!("*/{}", a.subresource);
            self.resources
                .iter()
                .any(|r| r == "*" || *r == wanted || *r == any_sub)
        };
        any(&self.verbs, a.verb)
            && any(&self.api_groups, &a.group)
            && resource
            && (self.resource_names.is_empty()
                || (!a.name.is_empty() && self.resource_names.contains(&a.name)))
    }
}

/// A subject of a binding.
#[derive(Debug, Deserialize)]
struct Subject {
    kind: String,
    name: String,
    #[serde(default)]
    namespace: String,
}

impl Subject {
    fn names(&self, user: &User) -> bool {
        match self.kind.as_str() {
            "ServiceAccount" => {
                user.name == format!("system:serviceaccount:{}:{}", self.namespace, self.name)
            }
            "User" => user.name == self.name,
            "Group" => user.groups.contains(&self.name),
            _ => false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RoleRef {
    kind: String,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Binding {
    #[serde(default)]
    subjects: Vec<Subject>,
    role_ref: RoleRef,
}

/// Whether some rule bound to `user` allows `a`.
pub(crate) fn allowed(store: &Store, user: &User, a: &Attributes) -> bool {
    let grants = |binding_kind: &str, namespace: Option<&str>| {
        objects(store, binding_kind, namespace)
            .into_iter()
            .filter_map(|b| serde_json::from_value::<Binding>(b).ok())
            .filter(|b| b.subjects.iter().any(|s| s.names(user)))
            .any(|b| role_rules(store, &b.role_ref, namespace).any(|r| r.allows(a)))
    };
    grants("ClusterRoleBinding", None)
        || (!a.namespace.is_empty() && grants("RoleBinding", Some(&a.namespace)))
}

/// The rules of the role a binding refers to (a RoleBinding's Role is in its namespace).
fn role_rules(
    store: &Store,
    role: &RoleRef,
    namespace: Option<&str>,
) -> impl Iterator<Item = Rule> {
    let object = match (role.kind.as_str(), namespace) {
        ("ClusterRole", _) => get(store, "ClusterRole", "", &role.name),
        ("Role", Some(ns)) => get(store, "Role", ns, &role.name),
        _ => None,
    };
    object
        .and_then(|o| o.get("rules").cloned())
        .and_then(|r| serde_json::from_value::<Vec<Rule>>(r).ok())
        .unwrap_or_default()
        .into_iter()
}

fn rbac_kind(kind: &str) -> usize {
    registry::by_kind("rbac.authorization.k8s.io/v1", kind).expect("RBAC kinds are registered")
}

fn objects(store: &Store, kind: &str, namespace: Option<&str>) -> Vec<Value> {
    store
        .objects(rbac_kind(kind), namespace)
        .into_iter()
        .map(|o| (*o).clone())
        .collect()
}

fn get(store: &Store, kind: &str, namespace: &str, name: &str) -> Option<Value> {
    store
        .get(rbac_kind(kind), namespace, name)
        .map(|o| (*o).clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(verb: &'static str, group: &str, resource: &str, sub: &str, ns: &str) -> Attributes {
        Attributes {
            verb,
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: String::new(),
        }
    }

    fn rule(yaml: &str) -> Rule {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn rules_match_verbs_groups_resources_and_subresources() {
        let r = rule(
            "{apiGroups: [cilium.io], resources: [ciliumnodes, ciliumnodes/status], verbs: [get, update]}",
        );
        assert!(r.allows(&attrs("get", "cilium.io", "ciliumnodes", "", "")));
        assert!(r.allows(&attrs("update", "cilium.io", "ciliumnodes", "status", "")));
        assert!(!r.allows(&attrs("list", "cilium.io", "ciliumnodes", "", "")));
        assert!(!r.allows(&attrs("get", "", "ciliumnodes", "", "")));
        assert!(!r.allows(&attrs("get", "cilium.io", "ciliumendpoints", "", "")));
        // The main resource does not grant its subresources.
        let r = rule("{apiGroups: ['*'], resources: [pods], verbs: ['*']}");
        assert!(r.allows(&attrs("delete", "x.io", "pods", "", "ns")));
        assert!(!r.allows(&attrs("update", "", "pods", "status", "ns")));
        let r = rule("{apiGroups: [''], resources: ['*/status'], verbs: [patch]}");
        assert!(r.allows(&attrs("patch", "", "pods", "status", "ns")));
        assert!(!r.allows(&attrs("patch", "", "pods", "", "ns")));
    }

    #[test]
    fn resource_names_allow_only_named_requests() {
        let r = rule(
            "{apiGroups: [coordination.k8s.io], resources: [leases], resourceNames: [op], verbs: [get, update]}",
        );
        let mut a = attrs("get", "coordination.k8s.io", "leases", "", "kube-system");
        assert!(!r.allows(&a), "a collection is not a named object");
        a.name = "op".into();
        assert!(r.allows(&a));
        a.name = "other".into();
        assert!(!r.allows(&a));
    }

    #[test]
    fn subjects_name_service_accounts_users_and_groups() {
        let user = User::service_account("kube-system", "cellium");
        let s = |yaml: &str| serde_yaml::from_str::<Subject>(yaml).unwrap().names(&user);
        assert!(s(
            "{kind: ServiceAccount, name: cellium, namespace: kube-system}"
        ));
        assert!(!s(
            "{kind: ServiceAccount, name: cellium, namespace: default}"
        ));
        assert!(s(
            "{kind: User, name: 'system:serviceaccount:kube-system:cellium'}"
        ));
        assert!(s(
            "{kind: Group, name: 'system:serviceaccounts:kube-system'}"
        ));
        assert!(!s("{kind: Group, name: 'system:masters'}"));
    }

    #[test]
    fn forbidden_reads_as_the_real_message() {
        let user = User::service_account("kube-system", "cellium");
        let a = attrs("list", "", "pods", "", "");
        assert_eq!(
            a.forbidden(&user),
            "pods is forbidden: User \"system:serviceaccount:kube-system:cellium\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
        );
        let mut a = attrs("update", "cilium.io", "ciliumnodes", "status", "");
        a.name = "n1".into();
        assert!(
            a.forbidden(&user)
                .starts_with("ciliumnodes \"n1\" is forbidden")
        );
        assert!(
            a.forbidden(&user)
                .contains("resource \"ciliumnodes/status\" in API group \"cilium.io\"")
        );
    }
}
