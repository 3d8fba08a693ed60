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

    /// Every readable record; unreadable ones are logged and skipped (and left on disk for a
    /// person to look at), so one corrupt file cannot keep the agent from starting.
    pub fn load(&self) -> Result<Vec<Endpoint>> {
        let names = self.0.list(DIR).map_err(|source| Error::State {
            endpoint: "records".into(),
            source,
        })?;
        let mut records = Vec::new();
        for name in names.iter().filter(|n| n.ends_with(".json")) {
            let rel = format!("{DIR}/{name}");
            match self.0.read(&rel) {
                Ok(Some(bytes)) => match serde_json::from_slice::<Endpoint>(&bytes) {
                    Ok(ep) => records.push(ep),
                    Err(e) => {
                        tracing::error!(file = %rel, error = %e, "unreadable endpoint record skipped")
                    }
                },
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(file = %rel, error = %e, "unreadable endpoint record skipped")
                }
            }
        }
        Ok(records)
    }
}

fn path(id: u16) -> String {
    format!("{DIR}/{id}.json")
}
