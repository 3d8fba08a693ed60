//! One kind's complete list from the API server, parsed as its objects arrive.
//!
//! A list is put in force only once it is complete ([`Feed::resync`]), but its objects need
//! not wait as the API server sent them: each is converted to its slim, typed form (or its
//! rejection) as soon as it arrives, so that what waits for the end of the list is what the
//! table will hold, not the API server's JSON, which is many times larger (a list of tens of
//! thousands of CiliumEndpoints held as JSON would be most of the agent's peak memory).

use serde_json::Value;

use crate::decoded::{BuiltIn, Decoded};
use crate::feed::{Feed, Taken, from_api, key_of};
use cellium_k8s_objects::ObjectKey;
use cellium_k8s_objects::validate::FieldError;

/// One object of a list: its key, and its typed form or why it cannot be put in force.
pub(crate) type Item = (ObjectKey, Result<Taken, FieldError>);

/// The objects of one kind's list so far, each parsed or rejected, in the order the API
/// server sent them. Obtained from [`Feed::listing`], put in force by [`Feed::resync`] once the
/// list is complete; dropping it (a list that restarts) changes nothing.
#[derive(Debug)]
pub struct Listing {
    kind: String,
    items: Vec<Item>,
}

impl Listing {
    pub(crate) fn new(kind: &str) -> Listing {
        Listing {
            kind: kind.to_string(),
            items: Vec::new(),
        }
    }

    /// Adds the next object of the list (as the API server sent it): parsed now, the JSON
    /// dropped. An object without a name cannot be named in a table nor in a rejection, and
    /// is left out, as [`Feed::apply`] leaves it out.
    pub fn push(&mut self, value: Value) {
        let Some(key) = key_of(&self.kind, &value) else {
            tracing::warn!(
                kind = self.kind,
                "an object without a name from the API server; ignored"
            );
            return;
        };
        let item = from_api(&self.kind, value);
        self.items.push((key, item));
    }

    /// [`push`](Listing::push) for an object of a built-in kind, decoded once. An object of
    /// another kind than the listing's is a mistake of the caller's, and left out.
    pub fn push_decoded<K: BuiltIn>(&mut self, object: Decoded<K>) {
        if object.kind() != self.kind {
            tracing::error!(
                kind = self.kind,
                other = object.kind(),
                "an object of another kind pushed to a listing; ignored"
            );
            return;
        }
        let Some(key) = object.key() else {
            tracing::warn!(
                kind = self.kind,
                "an object without a name from the API server; ignored"
            );
            return;
        };
        self.items.push((key, object.parse()));
    }

    /// The kind listed.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// How many objects the list holds so far (rejected ones included).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the list holds no object yet.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The kind and the objects, for [`Feed::resync`].
    pub(crate) fn into_parts(self) -> (String, Vec<Item>) {
        (self.kind, self.items)
    }
}

impl Feed {
    /// An empty list of `kind`, to fill as its objects arrive and hand to [`Feed::resync`].
    pub fn listing(&self, kind: &str) -> Listing {
        Listing::new(kind)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use std::sync::Arc;

    use super::*;
    use crate::config::ResourcesConfig;
    use crate::limits::Limits;
    use crate::resources::{Resources, Store};
    use crate::service_ip::ServiceRanges;

    /// Tables as in Kubernetes mode before the first lists: empty and not synced.
    fn unsynced() -> Arc<Resources> {
        let ranges = ServiceRanges::new(&ResourcesConfig::default().service_cidr).unwrap();
        Arc::new(Resources::build(
            Store::Memory,
            ranges,
            Limits::default(),
            None,
        ))
    }

    fn endpoint(name: &str, ipv4: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "shop", "managedFields": [{"manager": "x"}]},
               "status": {"id": 7, "identity": {"id": 300},
                          "networking": {"addressing": [{"ipv4": ipv4}], "node": "192.168.0.2"}}})
    }

    fn names(r: &Resources) -> Vec<String> {
        r.cilium_endpoints
            .list()
            .iter()
            .map(|e| e.name.clone())
            .collect()
    }

    fn rejections(r: &Resources) -> Vec<(String, String)> {
        r.lock()
            .rejected
            .iter()
            .map(|((_, key), r)| (key.to_string(), r.reason.clone()))
            .collect()
    }

    #[test]
    fn a_rejected_object_amid_a_list_leaves_the_others_in_force() {
        let r = unsynced();
        let feed = Feed::new(r.clone());
        let mut listing = feed.listing("CiliumEndpoint");
        listing.push(endpoint("a", "10.0.1.5"));
        listing.push(endpoint("bad", "10.0.1.999"));
        listing.push(json!({"metadata": {"namespace": "shop"}}));
        listing.push(endpoint("c", "10.0.1.7"));
        assert_eq!(listing.len(), 3, "the nameless object is left out");
        assert!(
            r.cilium_endpoints.is_empty(),
            "nothing in force before resync"
        );
        assert!(!r.cilium_endpoints.is_synced());
        feed.resync(listing);
        assert!(r.cilium_endpoints.is_synced());
        assert_eq!(names(&r), ["a", "c"]);
        let rejected = rejections(&r);
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert_eq!(rejected[0].0, "shop/bad");
        assert!(
            rejected[0]
                .1
                .starts_with("status.networking.addressing[0].ipv4"),
            "{rejected:?}"
        );
        // The next complete list without it clears its rejection.
        feed.resync(crate::feed::tests::list(
            &feed,
            "CiliumEndpoint",
            vec![endpoint("a", "10.0.1.5")],
        ));
        assert_eq!(names(&r), ["a"]);
        assert!(rejections(&r).is_empty());
    }

    #[test]
    fn a_list_that_restarts_discards_its_half_and_changes_nothing_until_complete() {
        let r = unsynced();
        let feed = Feed::new(r.clone());
        let mut listing = feed.listing("CiliumEndpoint");
        listing.push(endpoint("a", "10.0.1.5"));
        // The first list restarts: nothing of its half is in force, nor is the table synced.
        listing = feed.listing(listing.kind());
        assert!(r.cilium_endpoints.is_empty() && !r.cilium_endpoints.is_synced());
        listing.push(endpoint("a", "10.0.1.5"));
        listing.push(endpoint("b", "10.0.1.6"));
        feed.resync(listing);
        assert!(r.cilium_endpoints.is_synced());
        // A relist (the watch expired): its first page arrives, then the list restarts.
        let mut listing = feed.listing("CiliumEndpoint");
        listing.push(endpoint("x", "10.0.1.9"));
        listing.push(endpoint("bad", "not an address"));
        let mut events = r.cilium_endpoints.subscribe();
        listing = feed.listing(listing.kind());
        assert!(listing.is_empty());
        assert_eq!(names(&r), ["a", "b"], "the half list changed nothing");
        assert!(rejections(&r).is_empty());
        listing.push(endpoint("b", "10.0.1.6"));
        listing.push(endpoint("c", "10.0.1.8"));
        feed.resync(listing);
        assert_eq!(names(&r), ["b", "c"]);
        let mut seen = Vec::new();
        while let Ok(e) = events.try_recv() {
            seen.push(match e {
                crate::Event::Upsert { new, .. } => format!("upsert {}", new.name),
                crate::Event::Delete(old) => format!("delete {}", old.name),
            });
        }
        assert_eq!(seen, ["upsert c", "delete a"], "b is unchanged");
    }
}
