//! The built-in kinds decoded once, straight from the API server's bytes.
//!
//! A list of a built-in kind is decoded by the watcher into [`Decoded`] objects: each item
//! goes straight into its k8s-openapi type, which the feed turns into the tables' slim form
//! (the same checks as any other path). Going through a dynamic object and JSON first would
//! decode each object three times, most of the time of a sync. An item that does not decode
//! must not fail its whole list (the kind would never sync): it is kept as its metadata and
//! the field that failed, and the feed rejects it alone, as it rejects an object that fails a
//! check.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{Deserialize, DeserializeOwned, Deserializer};
use serde_json::value::RawValue;

use crate::feed::{Taken, as_decided, key_from};
use crate::unknown::{self, Treatment};
use cellium_k8s_objects::ObjectKey;
use cellium_k8s_objects::document::decode_noting;
use cellium_k8s_objects::kinds::Parsed;
use cellium_k8s_objects::validate::FieldError;
use cellium_k8s_objects::{EndpointSlice, Namespace, NetworkPolicy, Node, Pod, Service};

/// An object of a built-in kind from the API server: decoded, or why it does not decode.
#[derive(Clone, Debug)]
pub enum Decoded<K> {
    /// The object, and the fields of it this version does not know that its kind reports
    /// ([`crate::unknown`]).
    Object(K, Vec<String>),
    /// An object that does not decode: its metadata (as far as it decodes, for its key and
    /// resource version) and the field that failed.
    Invalid {
        /// What of `metadata` decodes.
        metadata: Box<ObjectMeta>,
        /// The field that failed and why.
        error: FieldError,
    },
}

impl<'de, K: BuiltIn> Deserialize<'de> for Decoded<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Delimited first (a scan, no parse), so that a failure inside leaves the rest of the
        // list readable.
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        let invalid = |error| Decoded::Invalid {
            metadata: Box::new(metadata_of(raw.get())),
            error,
        };
        // The kinds whose unknown fields count are decoded with their paths tracked.
        if unknown::treatment(K::TABLE_KIND) != Treatment::Skip {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            let judged = decode_noting::<K, _>(&mut de)
                .and_then(|(object, fields)| Ok((object, unknown::judge(K::TABLE_KIND, fields)?)));
            return Ok(match judged {
                Ok((object, fields)) => Decoded::Object(object, fields),
                Err(error) => invalid(error),
            });
        }
        // The others plainly: tracking the path of every field costs a good part of the
        // decode, and only an object that fails needs it. That one is decoded again, with the
        // path, to name its field (the same input fails at the same field).
        if let Ok(object) = serde_json::from_str::<K>(raw.get()) {
            return Ok(Decoded::Object(object, Vec::new()));
        }
        let mut de = serde_json::Deserializer::from_str(raw.get());
        Ok(match serde_path_to_error::deserialize::<_, K>(&mut de) {
            Ok(object) => Decoded::Object(object, Vec::new()),
            Err(e) => invalid(path_error(e)),
        })
    }
}

fn metadata_of(text: &str) -> ObjectMeta {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(default)]
        metadata: ObjectMeta,
    }
    serde_json::from_str::<Meta>(text)
        .map(|m| m.metadata)
        .unwrap_or_default()
}

/// A decoding error as the field it names.
pub(crate) fn path_error<E: fmt::Display>(e: serde_path_to_error::Error<E>) -> FieldError {
    let field = e.path().to_string();
    let field = if field == "." { String::new() } else { field };
    FieldError::new(field, e.into_inner().to_string())
}

impl<K: k8s_openapi::Resource> k8s_openapi::Resource for Decoded<K> {
    const API_VERSION: &'static str = K::API_VERSION;
    const GROUP: &'static str = K::GROUP;
    const KIND: &'static str = K::KIND;
    const VERSION: &'static str = K::VERSION;
    const URL_PATH_SEGMENT: &'static str = K::URL_PATH_SEGMENT;
    type Scope = K::Scope;
}

impl<K: k8s_openapi::Metadata<Ty = ObjectMeta>> k8s_openapi::Metadata for Decoded<K> {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        match self {
            Decoded::Object(k, _) => k.metadata(),
            Decoded::Invalid { metadata, .. } => metadata,
        }
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Decoded::Object(k, _) => k.metadata_mut(),
            Decoded::Invalid { metadata, .. } => metadata,
        }
    }
}

impl<K: BuiltIn> Decoded<K> {
    /// The tables' kind.
    pub fn kind(&self) -> &'static str {
        K::TABLE_KIND
    }

    /// The object's key; `None` without a name.
    pub(crate) fn key(&self) -> Option<ObjectKey> {
        use k8s_openapi::Metadata;
        let meta = self.metadata();
        key_from(
            K::TABLE_KIND,
            meta.name.as_deref()?,
            meta.namespace.as_deref(),
        )
    }

    /// The tables' form of the object, or why it cannot be put in force.
    pub(crate) fn parse(self) -> Result<Taken, FieldError> {
        match self {
            Decoded::Object(k, unknown) => k.parse().0.map(|parsed| Taken { parsed, unknown }),
            Decoded::Invalid { error, .. } => Err(error),
        }
    }
}

mod sealed {
    use super::{FieldError, Parsed};

    /// The tables' form of an object, or why it cannot be put in force; opaque outside.
    pub struct Item(pub(crate) Result<Parsed, FieldError>);

    /// What the feed needs of a built-in kind, out of reach of other crates.
    pub trait Sealed {
        /// The kind as the tables name it.
        const TABLE_KIND: &'static str;

        /// The tables' form of the object.
        fn parse(self) -> Item;
    }
}

use sealed::Sealed;

/// The built-in kinds the tables hold, as k8s-openapi types.
pub trait BuiltIn:
    sealed::Sealed
    + k8s_openapi::Resource
    + k8s_openapi::Metadata<Ty = ObjectMeta>
    + DeserializeOwned
    + Clone
    + fmt::Debug
    + Send
    + Sync
    + 'static
{
}

macro_rules! built_in {
    ($k8s:ty, $slim:ident) => {
        impl BuiltIn for $k8s {}
        impl Sealed for $k8s {
            const TABLE_KIND: &'static str = $slim::KIND;
            fn parse(self) -> sealed::Item {
                sealed::Item($slim::from_k8s(self).map(Parsed::$slim))
            }
        }
    };
}

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;

use cellium_k8s_objects::Object;

built_in!(core::Namespace, Namespace);
built_in!(core::Pod, Pod);
built_in!(core::Node, Node);
built_in!(discovery::EndpointSlice, EndpointSlice);
built_in!(networking::NetworkPolicy, NetworkPolicy);

impl BuiltIn for core::Service {}
impl Sealed for core::Service {
    const TABLE_KIND: &'static str = Service::KIND;
    fn parse(self) -> sealed::Item {
        let parsed = Service::from_k8s(self).and_then(|mut draft| {
            as_decided(&mut draft)?;
            Ok(Parsed::Service(Box::new(draft)))
        });
        sealed::Item(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feed::Feed;
    use crate::resources::Resources;

    type Pods = Vec<Decoded<core::Pod>>;

    fn pod(name: &str, port: &str) -> String {
        format!(
            r#"{{"metadata": {{"name": "{name}", "namespace": "shop", "resourceVersion": "7",
                "managedFields": [{{"manager": "kubectl"}}]}},
               "spec": {{"nodeName": "n1", "containers": [{{"name": "c",
                        "ports": [{{"name": "http", "containerPort": {port}}}]}}]}},
               "status": {{"phase": "Running", "someFutureField": 1}}}}"#
        )
    }

    fn decode(items: &[String]) -> Pods {
        serde_json::from_str(&format!("[{}]", items.join(","))).unwrap()
    }

    #[test]
    fn an_object_that_does_not_decode_is_rejected_alone_naming_its_field() {
        let r = Resources::new();
        let feed = Feed::new(r.clone());
        let items = decode(&[pod("a", "80"), pod("bad", "\"eighty\""), pod("c", "81")]);
        use k8s_openapi::Metadata;
        // The watcher needs the bad object's metadata too (its resource version).
        assert_eq!(items[1].metadata().resource_version.as_deref(), Some("7"));
        let mut listing = feed.listing("Pod");
        for item in items {
            listing.push_decoded(item);
        }
        feed.resync(listing);
        assert!(r.pods.is_synced());
        let names: Vec<_> = r.pods.list().iter().map(|p| p.name.clone()).collect();
        assert_eq!(names, ["a", "c"]);
        let rejected = r.lock().rejected.clone();
        let reason = &rejected[&("Pod".to_string(), ObjectKey::namespaced("shop", "bad"))].reason;
        assert!(
            reason.starts_with("spec.containers[0].ports[0].containerPort"),
            "{reason}"
        );
    }

    #[test]
    fn a_relist_of_decoded_objects_deletes_what_vanished_and_events_follow() {
        let r = Resources::new();
        let feed = Feed::new(r.clone());
        let mut listing = feed.listing("Pod");
        for item in decode(&[pod("a", "80"), pod("b", "80")]) {
            listing.push_decoded(item);
        }
        feed.resync(listing);
        let mut events = r.pods.subscribe();
        let mut listing = feed.listing("Pod");
        for item in decode(&[pod("b", "80"), pod("c", "80")]) {
            listing.push_decoded(item);
        }
        feed.resync(listing);
        let names: Vec<_> = r.pods.list().iter().map(|p| p.name.clone()).collect();
        assert_eq!(names, ["b", "c"]);
        let mut seen = Vec::new();
        while let Ok(e) = events.try_recv() {
            seen.push(match e {
                crate::Event::Upsert { new, .. } => format!("upsert {}", new.name),
                crate::Event::Delete(old) => format!("delete {}", old.name),
            });
        }
        assert_eq!(seen, ["upsert c", "delete a"]);
        // Watch events: an update that no longer decodes takes the old version out; a delete.
        let mut bad = decode(&[pod("b", "\"x\"")]);
        feed.apply_decoded(bad.remove(0));
        assert!(r.pods.get(&ObjectKey::namespaced("shop", "b")).is_none());
        let mut c = decode(&[pod("c", "80")]);
        feed.delete_decoded(&c.remove(0));
        assert!(r.pods.is_empty());
        assert!(
            r.lock()
                .rejected
                .contains_key(&("Pod".to_string(), ObjectKey::namespaced("shop", "b")))
        );
    }

    #[test]
    fn an_object_of_another_kind_is_not_pushed_to_a_listing() {
        let r = Resources::new();
        let feed = Feed::new(r.clone());
        let mut listing = feed.listing("Namespace");
        for item in decode(&[pod("a", "80")]) {
            listing.push_decoded(item);
        }
        assert!(listing.is_empty());
    }
}
