//! Keeping the allocator's record in the state directory: written by every change that
//! alters it, read back by the `restore-ipam` start hook.
//!
//! Faults, and what they do:
//! - a write that fails (disk full, read-only file system) fails the call that needed it,
//!   with nothing changed, and turns the module Degraded until a write succeeds;
//! - a process killed mid-write leaves the old record or the new one, never a torn one
//!   (the state directory writes atomically);
//! - a record that cannot be read or decoded at start turns the module Degraded and is kept
//!   aside as `ipam.json.corrupt`; since any address may have been released just before,
//!   every address nobody holds is kept in quarantine for one period from the start. The
//!   cursor is lost too, which that quarantine covers;
//! - entries from the future (a clock set back, a hostile file) count from now, and a
//!   blanket quarantine lasts at most one period from now.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use cellium_hive::Reporter;
use cellium_hive::error_chain as chain;
use cellium_statedir::StateDir;

use crate::error::{Error, Result};
use crate::ipam::{Inner, Ipam};
use crate::quarantine::Quarantine;
use crate::record::{FILE, Record, from_ms};

/// Where the record goes, and the module's health as far as the record is concerned.
#[derive(Debug)]
pub(crate) struct Store {
    dir: Arc<StateDir>,
    reporter: Reporter,
    /// Whether the module reports a problem with the record; the next good write clears it
    /// once no blanket quarantine is left.
    troubled: AtomicBool,
}

impl Store {
    pub(crate) fn new(dir: Arc<StateDir>, reporter: Reporter) -> Store {
        Store {
            dir,
            reporter,
            troubled: AtomicBool::new(false),
        }
    }

    /// Writes `record`, atomically; left to the page cache like the endpoint records: the
    /// addresses it describes do not outlive the node's kernel.
    pub(crate) fn write(
        &self,
        record: &Record,
        quarantine: &Quarantine,
        now: SystemTime,
    ) -> Result<()> {
        match self.dir.write_volatile(FILE, &record.encode()) {
            Ok(()) => {
                if quarantine.entries().1.is_none_or(|until| until <= now)
                    && self.troubled.swap(false, Ordering::SeqCst)
                {
                    self.reporter.ok(format!("{FILE} written again"));
                }
                Ok(())
            }
            Err(source) => {
                self.troubled.store(true, Ordering::SeqCst);
                self.reporter.degraded(format!(
                    "cannot write {FILE}: {}; allocations and releases fail until it can be written",
                    chain(&source)
                ));
                Err(Error::Record { source })
            }
        }
    }

    fn trouble(&self, message: String) {
        self.troubled.store(true, Ordering::SeqCst);
        self.reporter.degraded(message);
    }
}

impl Ipam {
    /// Reads the record back: the `restore-ipam` start hook. Never fails the start: an
    /// unreadable record is answered by quarantining every free address (see the module
    /// docs), which keeps the allocator safe while the endpoints restore.
    pub(crate) fn restore_record(&self) {
        let Some(store) = self.store() else {
            return;
        };
        let now = SystemTime::now();
        let mut inner = self.lock();
        let loaded = match store.dir.read(FILE) {
            Ok(None) => Ok(None),
            Ok(Some(bytes)) => Record::decode(&bytes).map(Some).map_err(|e| {
                let aside = format!("{FILE}.corrupt");
                if let Err(e) = store.dir.write(&aside, &bytes) {
                    tracing::warn!(error = %chain(&e), "cannot keep the undecodable record aside");
                }
                format!("{FILE} cannot be decoded ({e}; kept as {aside})")
            }),
            Err(e) => Err(format!("{FILE} cannot be read ({})", chain(&e))),
        };
        match loaded {
            Ok(record) => {
                let summary = apply(&mut inner, record.as_ref(), now);
                inner.written = record;
                match inner.quarantine.entries().1 {
                    Some(until) => store.trouble(format!(
                        "every address nobody holds is in quarantine until {} (the record was unreadable at an earlier start)",
                        humantime::format_rfc3339_seconds(until)
                    )),
                    None => store.reporter.ok(summary),
                }
            }
            Err(why) => {
                inner.quarantine.add_all(now);
                let until = humantime::format_rfc3339_seconds(now + inner.quarantine.period());
                tracing::error!(
                    "{why}: every address nobody holds is kept in quarantine until {until}"
                );
                store.trouble(format!(
                    "{why}; every address nobody holds is in quarantine until {until}, as any may have been released just before"
                ));
            }
        }
        // Best effort: pruned entries, cursors of new pools, the blanket of a lost record.
        if let Err(e) = self.persist(&mut inner, now) {
            tracing::warn!(error = %chain(&e), "the record is written with the next change");
        }
    }
}

/// Applies a record read back; returns a summary for the health report.
fn apply(inner: &mut Inner, record: Option<&Record>, now: SystemTime) -> String {
    let pools = inner.pools.len();
    let Some(record) = record else {
        return format!("{pools} pools; no record yet");
    };
    let mut cursors = 0;
    for pool in &mut inner.pools {
        if let Some(cursor) = record.cursors.get(&pool.cidr()) {
            pool.set_cursor(*cursor);
            cursors += 1;
        }
    }
    for (ip, released) in &record.quarantine {
        // Entries of pools no longer configured are dropped with the next write.
        if inner.pools.iter().any(|p| p.contains(*ip)) {
            inner.quarantine.restore(*ip, from_ms(*released), now);
        }
    }
    if let Some(until) = record.all_until {
        inner.quarantine.set_all_until(from_ms(until), now);
    }
    inner.quarantine.prune(now);
    let quarantined = inner.quarantine.entries().0.len();
    format!("{pools} pools; {cursors} cursors and {quarantined} addresses in quarantine restored")
}
