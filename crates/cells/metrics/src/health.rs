//! Module health as metrics, refreshed from the health tree at every scrape.

use std::sync::atomic::AtomicU64;
use std::time::UNIX_EPOCH;

use cellium_hive::{Health, HealthNode, Level};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabels {
    module: String,
    level: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModuleLabels {
    module: String,
}

/// The health gauges; `refresh` rewrites them from the tree.
#[derive(Debug, Clone, Default)]
pub(crate) struct HealthMetrics {
    level: Family<LevelLabels, Gauge>,
    changed: Family<ModuleLabels, Gauge<f64, AtomicU64>>,
}

const LEVELS: [(Level, &str); 4] = [
    (Level::Ok, "ok"),
    (Level::Degraded, "degraded"),
    (Level::Stopped, "stopped"),
    (Level::Unknown, "unknown"),
];

impl HealthMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "module_health",
            "Health of each module and job: 1 for its current level, 0 for the others",
            self.level.clone(),
        );
        registry.register(
            "module_health_changed_timestamp_seconds",
            "When each module's health last changed (Unix time)",
            self.changed.clone(),
        );
    }

    pub(crate) fn refresh(&self, health: &Health) {
        // Modules may have gone (a stopped job); clearing first drops their series.
        self.level.clear();
        self.changed.clear();
        let mut stack: Vec<HealthNode> = health.tree();
        while let Some(node) = stack.pop() {
            for (level, name) in LEVELS {
                let labels = LevelLabels {
                    module: node.id.clone(),
                    level: name,
                };
                let value = i64::from(node.status.level == level);
                self.level.get_or_create(&labels).set(value);
            }
            let since = node
                .status
                .since
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            self.changed
                .get_or_create(&ModuleLabels {
                    module: node.id.clone(),
                })
                .set(since);
            stack.extend(node.children);
        }
    }
}

#[cfg(test)]
mod tests {
    use cellium_hive::{Hive, Module, Reporter};
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[tokio::test]
    async fn every_level_is_exported_unknown_included() {
        let mut hive = Hive::new([
            Module::new("statedir", "x").into(),
            // Takes a reporter and never reports: Unknown once started.
            Module::new("ipam", "x").invoke(|_: Reporter| {}).into(),
        ]);
        hive.start().await.unwrap();
        let metrics = HealthMetrics::default();
        let mut registry = Registry::with_prefix("cellium");
        metrics.register(&mut registry);
        metrics.refresh(&hive.health());
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "cellium_module_health{module=\"ipam\",level=\"unknown\"} 1",
            "cellium_module_health{module=\"ipam\",level=\"ok\"} 0",
            "cellium_module_health{module=\"statedir\",level=\"ok\"} 1",
            "cellium_module_health{module=\"statedir\",level=\"unknown\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        hive.stop().await.unwrap();
    }
}
