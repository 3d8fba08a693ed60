//! LIST pages: the first page freezes the result, later pages read the frozen copy.

use super::Store;
use crate::error::{Error, Result};
use crate::selector::Selector;
use crate::util;
use serde_json::Value;
use std::sync::Arc;

/// A LIST's frozen result, so later pages are consistent with the first page's resourceVersion.
pub(super) struct Snapshot {
    rv: u64,
    items: Vec<Arc<Value>>,
}

/// How many unfinished paginated LISTs are remembered.
const SNAPSHOTS: usize = 32;

/// One page of a LIST.
pub struct Page {
    /// The list's resourceVersion (the same on every page).
    pub rv: u64,
    /// The objects of this page.
    pub items: Vec<Arc<Value>>,
    /// The token for the next page, if any.
    pub continue_token: Option<String>,
    /// How many items follow this page.
    pub remaining: usize,
}

impl Store {
    /// A LIST page: the first page (no `token`) freezes the result for the pages after it.
    pub fn list(
        &mut self,
        kind: usize,
        namespace: Option<&str>,
        selector: &Selector,
        limit: Option<usize>,
        token: Option<&str>,
    ) -> Result<Page> {
        let (id, rv, offset) = match token {
            Some(t) => decode_token(t)?,
            None => {
                let items: Vec<Arc<Value>> = self
                    .objects(kind, namespace)
                    .into_iter()
                    .filter(|o| selector.matches(o))
                    .collect();
                let limit = limit.unwrap_or(usize::MAX);
                if items.len() <= limit {
                    return Ok(Page {
                        rv: self.rv,
                        items,
                        continue_token: None,
                        remaining: 0,
                    });
                }
                self.next_id += 1;
                let id = self.next_id;
                self.snapshots.insert(id, Snapshot { rv: self.rv, items });
                self.snapshot_order.push_back(id);
                while self.snapshot_order.len() > SNAPSHOTS {
                    if let Some(old) = self.snapshot_order.pop_front() {
                        self.snapshots.remove(&old);
                    }
                }
                (id, self.rv, 0)
            }
        };
        let snapshot = self
            .snapshots
            .get(&id)
            .filter(|s| s.rv == rv)
            .ok_or(Error::Expired {
                requested: rv,
                oldest: self.compacted,
            })?;
        let end = offset
            .saturating_add(limit.unwrap_or(usize::MAX))
            .min(snapshot.items.len());
        let items = snapshot.items.get(offset..end).unwrap_or_default().to_vec();
        let remaining = snapshot.items.len() - end;
        let continue_token = (remaining > 0).then(|| encode_token(id, rv, end));
        if remaining == 0 {
            self.snapshots.remove(&id);
            self.snapshot_order.retain(|x| *x != id);
        }
        Ok(Page {
            rv,
            items,
            continue_token,
            remaining,
        })
    }
}

fn encode_token(id: u64, rv: u64, offset: usize) -> String {
    util::hex(format!("{id}:{rv}:{offset}").as_bytes())
}

fn decode_token(token: &str) -> Result<(u64, u64, usize)> {
    let bad = || Error::BadRequest(format!("invalid continue token {token:?}"));
    let text = String::from_utf8(util::unhex(token).ok_or_else(bad)?).map_err(|_| bad())?;
    let mut parts = text.split(':');
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse::<u64>().ok())
            .ok_or_else(bad)
    };
    Ok((next()?, next()?, next()? as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::by_kind;
    use crate::store::{name_of, tests_support::pod};

    #[test]
    fn pagination_tokens_round_trip_and_pages_are_consistent() {
        let mut s = Store::new(100);
        let pods = by_kind("v1", "Pod").unwrap();
        for i in 0..5 {
            s.create(pods, None, pod(&format!("p{i}"), "default", "a"), false)
                .unwrap();
        }
        let sel = Selector::default();
        let first = s.list(pods, None, &sel, Some(2), None).unwrap();
        assert_eq!(first.items.len(), 2);
        assert_eq!(first.remaining, 3);
        let rv = first.rv;
        // A write between pages does not show up in the later pages.
        s.create(pods, None, pod("p9", "default", "a"), false)
            .unwrap();
        let token = first.continue_token.unwrap();
        assert_eq!(decode_token(&token).unwrap().1, rv);
        let second = s.list(pods, None, &sel, Some(2), Some(&token)).unwrap();
        let third = s
            .list(pods, None, &sel, Some(2), second.continue_token.as_deref())
            .unwrap();
        assert_eq!(second.rv, rv);
        assert_eq!(third.rv, rv);
        assert_eq!(third.items.len(), 1);
        assert!(third.continue_token.is_none());
        assert_eq!(name_of(&third.items[0]), "p4");
        assert!(decode_token("zz").is_err());
        assert!(matches!(
            s.list(pods, None, &sel, Some(2), Some(&token)),
            Err(Error::Expired { .. })
        ));
    }
}
