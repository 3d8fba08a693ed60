//! Endpoint records on disk: one JSON file per endpoint, written atomically.

use std::sync::Arc;

use cellium_statedir::StateDir;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};

const DIR: &str = "endpoints";

/// The endpoints' records in the state directory.
#[derive(Debug, Clone)]
pub struct Store(pub Arc<StateDir>);

impl Store {
    /// Writes (or rewrites) the record, atomically.
    ///
    /// Not flushed to disk: a record must survive a crash of the agent (it does: the kernel
    /// holds it), but not of the node, which takes the endpoint's veth pair, network namespace
    /// and datapath pins with it. Flushing would cost two fsyncs per write, milliseconds on a
    /// disk, twice per CNI ADD.
    pub fn save(&self, ep: &Endpoint) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(ep).unwrap_or_default();
        self.0
            .write_volatile(path(ep.id), &bytes)
            .map_err(|source| Error::State {
                endpoint: ep.describe(),
                source,
            })
    }

    /// Removes the record.
    pub fn remove(&self, ep: &Endpoint) -> Result<()> {
        self.0.remove(path(ep.id)).map_err(|source| Error::State {
            endpoint: ep.describe(),
            source,
        })
    }

    /// Every record. A record that cannot be read or parsed is not skipped silently: it is
    /// returned as [`Unreadable`] (and left on disk for a person to look at), so that the
    /// restore keeps whatever might belong to it. An error means the directory itself cannot
    /// be listed.
    pub fn load(&self) -> Result<Loaded> {
        let names = self.0.list(DIR).map_err(|source| Error::State {
            endpoint: "the endpoint records".into(),
            source,
        })?;
        let mut loaded = Loaded::default();
        for name in names.iter().filter(|n| n.ends_with(".json")) {
            let rel = format!("{DIR}/{name}");
            let unreadable = |reason: String| Unreadable {
                file: rel.clone(),
                id: name.strip_suffix(".json").and_then(|n| n.parse().ok()),
                reason,
            };
            match self.0.read(&rel) {
                Ok(Some(bytes)) => match serde_json::from_slice::<Endpoint>(&bytes) {
                    Ok(ep) => loaded.records.push(ep),
                    Err(e) => loaded.unreadable.push(unreadable(e.to_string())),
                },
                // Removed between the listing and the read: nothing to restore.
                Ok(None) => {}
                Err(e) => loaded.unreadable.push(unreadable(crate::error::chain(&e))),
            }
        }
        Ok(loaded)
    }
}

/// The records found in the state directory.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Those that were read.
    pub records: Vec<Endpoint>,
    /// Those that could not be.
    pub unreadable: Vec<Unreadable>,
}

/// A record that cannot be read or parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// Its path in the state directory (`endpoints/7.json`).
    pub file: String,
    /// The endpoint id its name gives, if it gives one.
    pub id: Option<u16>,
    /// Why it cannot be read.
    pub reason: String,
}

fn path(id: u16) -> String {
    format!("{DIR}/{id}.json")
}
