//! The identity table on disk: `identities.json` in the state directory.
//!
//! Written whole and atomically (the state directory's temp-file-and-rename), never on the
//! allocation path: allocations pull a trigger and a job writes the table, coalescing
//! bursts. Read once at start. Records that do not fit (bad labels, a number outside its
//! scope's range, a reserved label set, a number or label set seen twice) are skipped rather
//! than failing the agent (losing one identity's number costs a renumbering, refusing to
//! start costs the node), but never silently: the restore reports each, and keeps the file
//! as it was read (`identities.json.corrupt`) before anything writes over it.

use cellium_labels::Labels;
use cellium_statedir::StateDir;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::identity::Scope;
use crate::reserved::Reserved;

/// The file, relative to the state directory.
pub(crate) const FILE: &str = "identities.json";

/// Where the file is kept, as read, when something in it could not be restored.
pub(crate) const KEPT: &str = "identities.json.corrupt";

/// The format written by this version.
const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct Document {
    version: u32,
    identities: Vec<Record>,
}

/// One identity as stored: labels are kept as text so that one bad label skips one
/// record, not the file.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    id: u32,
    labels: Vec<String>,
}

/// Encodes `identities` (sorted by number) as the file's bytes.
pub(crate) fn encode<'a>(identities: impl Iterator<Item = (u32, &'a Labels)>) -> Vec<u8> {
    let doc = Document {
        version: VERSION,
        identities: identities
            .map(|(id, labels)| Record {
                id,
                labels: labels.to_strings(),
            })
            .collect(),
    };
    // Serializing plain strings and numbers cannot fail.
    serde_json::to_vec_pretty(&doc).unwrap_or_default()
}

/// Writes the encoded table.
pub(crate) fn write(dir: &StateDir, bytes: &[u8]) -> Result<()> {
    dir.write(FILE, bytes).map_err(|source| Error::State {
        op: "write",
        file: FILE,
        source,
    })
}

/// Reads the file: `Ok(None)` when there is none.
pub(crate) fn read(dir: &StateDir) -> Result<Option<Vec<u8>>> {
    dir.read(FILE).map_err(|source| Error::State {
        op: "read",
        file: FILE,
        source,
    })
}

/// The identities a file holds that can be restored, and why each other record cannot.
pub(crate) type Decoded = (Vec<(u32, Labels)>, Vec<String>);

/// Decodes the file into the identities it holds that can be restored, each checked on its
/// own: `(id, labels)` pairs with valid, non-reserved labels whose number lies in the range
/// of their scope; and why each other record was skipped.
pub(crate) fn decode(bytes: &[u8]) -> Result<Decoded> {
    let doc: Document =
        serde_json::from_slice(bytes).map_err(|source| Error::Decode { file: FILE, source })?;
    if doc.version != VERSION {
        tracing::warn!(
            version = doc.version,
            "identity table of another version; reading it as version {VERSION}"
        );
    }
    let mut out = Vec::with_capacity(doc.identities.len());
    let mut skipped = Vec::new();
    for record in doc.identities {
        match check(&record) {
            Ok(labels) => out.push((record.id, labels)),
            Err(reason) => skipped.push(format!(
                "identity {} ({}) skipped: {reason}",
                record.id,
                record.labels.join(",")
            )),
        }
    }
    Ok((out, skipped))
}

fn check(record: &Record) -> Result<Labels, String> {
    let labels: Labels = record
        .labels
        .join(",")
        .parse()
        .map_err(|e: cellium_labels::Error| e.to_string())?;
    if labels.is_empty() {
        return Err("no labels".into());
    }
    if Reserved::for_labels(&labels) != Ok(None) {
        return Err("reserved labels are not allocated".into());
    }
    let scope = Scope::for_labels(&labels);
    if Scope::of(record.id) != Some(scope) {
        return Err(format!("the number is not in the {scope} range"));
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips() {
        let a: Labels = "k8s:app=web".parse().unwrap();
        let b = Labels::for_cidr("10.0.0.0/8".parse().unwrap());
        let bytes = encode([(256, &a), (16_777_216, &b)].into_iter());
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains("\"k8s:app=web\""), "{text}");
        assert_eq!(decode(&bytes).unwrap().0, vec![(256, a), (16_777_216, b)]);
    }

    #[test]
    fn records_that_do_not_fit_are_skipped() {
        let text = r#"{"version":1,"identities":[
            {"id":256,"labels":["k8s:app=web"]},
            {"id":257,"labels":["k8s:=bad"]},
            {"id":258,"labels":[]},
            {"id":1,"labels":["reserved:host"]},
            {"id":259,"labels":["cidr:10.0.0.0/8"]},
            {"id":16777300,"labels":["k8s:app=db"]},
            {"id":70000,"labels":["k8s:app=x"]}
        ]}"#;
        let (got, skipped) = decode(text.as_bytes()).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 256);
        assert_eq!(skipped.len(), 6);
        assert!(
            skipped[4]
                .starts_with("identity 16777300 (k8s:app=db) skipped: the number is not in the"),
            "{skipped:?}"
        );
    }

    #[test]
    fn garbage_is_an_error_naming_the_file() {
        let err = decode(b"{not json").unwrap_err();
        assert!(err.to_string().contains("identities.json"), "{err}");
    }
}
