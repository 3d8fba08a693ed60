//! The allocator's record in the state directory: where each pool's round-robin cursor
//! stands and which addresses are in quarantine, so that neither is forgotten by a restart.
//!
//! Who holds which address is not recorded here: endpoints are that record, and the
//! endpoint manager re-reserves their addresses at start.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The file, relative to the state directory.
pub(crate) const FILE: &str = "ipam.json";

/// The record's format version.
const VERSION: u32 = 1;

/// What `ipam.json` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct Record {
    pub(crate) version: u32,
    /// The last address handed out of each pool, by the pool's CIDR.
    pub(crate) cursors: BTreeMap<IpNet, IpAddr>,
    /// Addresses in quarantine, with their release time in milliseconds since the epoch.
    pub(crate) quarantine: BTreeMap<IpAddr, u64>,
    /// Every address not held is in quarantine until then (milliseconds since the epoch).
    #[serde(default)]
    pub(crate) all_until: Option<u64>,
}

impl Record {
    pub(crate) fn new() -> Record {
        Record {
            version: VERSION,
            ..Record::default()
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        // A map of strings and numbers always serializes.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Record, String> {
        let record: Record = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if record.version != VERSION {
            return Err(format!(
                "format version {} is not {VERSION}",
                record.version
            ));
        }
        Ok(record)
    }
}

pub(crate) fn to_ms(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

pub(crate) fn from_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_a_bad_one_says_why() {
        let mut r = Record::new();
        r.cursors
            .insert("10.0.0.0/24".parse().unwrap(), "10.0.0.9".parse().unwrap());
        r.quarantine
            .insert("10.0.0.5".parse().unwrap(), 1_700_000_000_000);
        assert_eq!(Record::decode(&r.encode()).unwrap(), r);
        let text = String::from_utf8(r.encode()).unwrap();
        assert!(text.contains("\"10.0.0.0/24\": \"10.0.0.9\""), "{text}");
        assert!(Record::decode(b"{\"version\": 1,").is_err());
        let future =
            Record::decode(b"{\"version\": 2, \"cursors\": {}, \"quarantine\": {}}").unwrap_err();
        assert!(future.contains("version 2"), "{future}");
        assert!(
            Record::decode(b"{\"version\": 1, \"cursors\": {\"x\": \"y\"}, \"quarantine\": {}}")
                .is_err()
        );
    }
}
