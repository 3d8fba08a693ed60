//! `cel_metrics`: per-CPU packet and byte counters by (direction, reason),
//! summed over CPUs when read.

use crate::abi::{MetricsValue, Plain};
use crate::error::{Error, Result};
use crate::maps::TypedMap;
use crate::types::{Direction, Reason};
use libbpf_rs::{MapCore, MapFlags};

/// The map name.
pub const NAME: &str = "cel_metrics";

/// Slots per direction (`CEL_REASON_SLOTS`).
const REASON_SLOTS: u32 = 256;

/// `CEL_REASON_EVENTS_LOST`: not a verdict; its ingress slot counts the events `cel_events`
/// had no room for.
pub const EVENTS_LOST_REASON: u8 = 255;

/// One counter, summed over CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricSample {
    /// Direction.
    pub direction: Direction,
    /// Forwarded or a drop reason.
    pub reason: Reason,
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The counters.
#[derive(Debug)]
pub struct Metrics {
    map: TypedMap<u32, MetricsValue>,
}

impl Metrics {
    pub(crate) fn new(map: TypedMap<u32, MetricsValue>) -> Self {
        Self { map }
    }

    /// The counter of one (direction, reason), summed over CPUs.
    pub fn get(&self, direction: Direction, reason: Reason) -> Result<MetricSample> {
        let key = u32::from(direction.as_u8()) * REASON_SLOTS + u32::from(reason.as_u8());
        let per_cpu = self
            .map
            .handle()
            .lookup_percpu(&key.encode(), MapFlags::ANY)
            .map_err(Error::map_op(self.map.name(), "lookup"))?
            .unwrap_or_default();
        let mut sample = MetricSample {
            direction,
            reason,
            packets: 0,
            bytes: 0,
        };
        for bytes in per_cpu {
            // Per-CPU values are padded to 8 bytes; ours is 16 already.
            let v = MetricsValue::decode(bytes.get(..MetricsValue::SIZE).unwrap_or(&bytes)).ok_or(
                Error::Layout {
                    map: self.map.name(),
                    len: bytes.len(),
                    expected: MetricsValue::SIZE,
                },
            )?;
            sample.packets += v.packets;
            sample.bytes += v.bytes;
        }
        Ok(sample)
    }

    /// Events the datapath could not submit because `cel_events` was full, since the map was
    /// created (summed over CPUs).
    pub fn events_lost(&self) -> Result<u64> {
        Ok(self
            .get(Direction::Ingress, Reason::from(EVENTS_LOST_REASON))?
            .packets)
    }

    /// Every non-zero counter of the reasons this version knows.
    pub fn all(&self) -> Result<Vec<MetricSample>> {
        let mut out = Vec::new();
        for direction in Direction::ALL {
            for reason in Reason::KNOWN {
                let s = self.get(direction, reason)?;
                if s.packets != 0 {
                    out.push(s);
                }
            }
        }
        Ok(out)
    }

    /// Packets dropped for any reason, both directions.
    pub fn drops(&self) -> Result<u64> {
        Ok(self
            .all()?
            .iter()
            .filter(|s| s.reason.is_drop())
            .map(|s| s.packets)
            .sum())
    }
}
