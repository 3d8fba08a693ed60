//! The datapath's counters as Prometheus metrics, read at each scrape.

use std::sync::{Arc, OnceLock};

use cellium_datapath_bpf::Datapath;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

/// Reads the per-CPU counters of the datapath (summed) when scraped.
#[derive(Debug)]
pub(crate) struct Counters(pub(crate) Arc<OnceLock<Arc<Datapath>>>);

impl Collector for Counters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(dp) = self.0.get() else {
            return Ok(());
        };
        // A failed read yields no samples rather than a failed scrape of every other metric.
        let samples = dp.metrics().all().unwrap_or_default();
        for (name, help, value) in [
            (
                "datapath_packets",
                "Packets seen by the datapath, by direction and reason (forwarded or a drop reason)",
                (|s: &cellium_datapath_bpf::MetricSample| s.packets) as fn(&_) -> u64,
            ),
            (
                "datapath_bytes",
                "Bytes seen by the datapath, by direction and reason",
                |s| s.bytes,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for sample in samples.iter().filter(|s| s.packets > 0) {
                let labels = [
                    ("direction", sample.direction.to_string()),
                    ("reason", sample.reason.to_string()),
                ];
                ConstCounter::new(value(sample)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
