//! The verbs on resource paths: GET, LIST, WATCH, POST, PUT, PATCH, DELETE.

use super::{Body, bytes_response, json_response, read_body};
use crate::error::Error;
use crate::patch;
use crate::rbac::{Attributes, User};
use crate::registry::{self, KINDS};
use crate::selector::{FieldSelector, LabelSelector, Selector};
use crate::server::ApiServer;
use crate::store::{self, Page};
use crate::util;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode, header};
use serde_json::Value;
use std::io::Write;

/// A parsed resource path.
struct Target<'a> {
    kind: usize,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
    /// The subresource named after the object's name (`status`, `finalize`).
    subresource: Option<&'a str>,
    status: bool,
}

fn parse_target<'a>(group: &str, version: &str, rest: &[&'a str]) -> Result<Target<'a>, Error> {
    let unknown = || Error::UnknownKind(format!("{}/{version}/{}", group, rest.join("/")));
    // `namespaces/NS/RESOURCE…` is a namespaced path unless the third segment is a
    // subresource of the Namespace itself.
    let (namespace, rest) = match rest {
        ["namespaces", ns, resource, tail @ ..] if !matches!(*resource, "status" | "finalize") => {
            (Some(*ns), [&[*resource][..], tail].concat())
        }
        _ => (None, rest.to_vec()),
    };
    let (resource, name, sub) = match rest.as_slice() {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub] => (*resource, Some(*name), Some(*sub)),
        _ => return Err(unknown()),
    };
    let kind = registry::by_resource(group, version, resource).ok_or_else(unknown)?;
    let k = &KINDS[kind];
    if namespace.is_some() && !k.namespaced {
        return Err(unknown());
    }
    let status = match sub {
        None => false,
        Some("status") if k.status => true,
        Some("finalize") if k.kind == "Namespace" => false,
        Some(_) => return Err(unknown()),
    };
    Ok(Target {
        kind,
        namespace,
        name,
        subresource: sub,
        status,
    })
}

/// What a request asks, in RBAC's terms.
fn attributes(target: &Target<'_>, query: &Query, method: &Method, group: &str) -> Attributes {
    let named = target.name.is_some();
    let verb = match (method.clone(), named) {
        (Method::GET, _) if query.flag("watch") => "watch",
        (Method::GET, true) => "get",
        (Method::GET, false) => "list",
        (Method::POST, _) => "create",
        (Method::PUT, _) => "update",
        (Method::PATCH, _) => "patch",
        (Method::DELETE, true) => "delete",
        (Method::DELETE, false) => "deletecollection",
        _ => "unknown",
    };
    Attributes {
        verb,
        group: group.to_string(),
        resource: KINDS[target.kind].resource.to_string(),
        subresource: target.subresource.unwrap_or("").to_string(),
        namespace: target.namespace.unwrap_or("").to_string(),
        name: target.name.unwrap_or("").to_string(),
    }
}

/// Query parameters, decoded.
struct Query(Vec<(String, String)>);

impl Query {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    fn dry_run(&self) -> bool {
        self.get("dryRun").is_some_and(|v| !v.is_empty())
    }

    fn selector(&self) -> Result<Selector, Error> {
        Ok(Selector {
            labels: LabelSelector::parse(self.get("labelSelector").unwrap_or(""))?,
            fields: FieldSelector::parse(self.get("fieldSelector").unwrap_or(""))?,
        })
    }
}

/// Handles a request under `/api/v1/…` or `/apis/GROUP/VERSION/…`.
pub async fn handle(
    server: &ApiServer,
    req: Request<Incoming>,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Response<Body>, Error> {
    let target = parse_target(group, version, rest)?;
    let query = Query(util::parse_query(req.uri().query().unwrap_or("")));
    let kind = target.kind;
    let k = &KINDS[kind];
    let ns = target.namespace;
    let store_ns = ns.unwrap_or("");
    let metadata = super::wants_metadata(&req);
    if let Some(user) = req.extensions().get::<User>() {
        let attributes = attributes(&target, &query, req.method(), group);
        server.authorize(user, attributes)?;
    }
    let ok = |v: &Value| Ok(json_response(StatusCode::OK, v));
    match (req.method().clone(), target.name) {
        (Method::GET, Some(name)) => {
            let obj = server.store().get(kind, store_ns, name);
            let obj = obj.ok_or_else(|| Error::NotFound {
                kind: k.qualified(),
                name: name.into(),
            })?;
            if metadata {
                ok(&super::metadata_only(&obj))
            } else {
                ok(&obj)
            }
        }
        (Method::GET, None) if query.flag("watch") => {
            let since =
                match query.get("resourceVersion") {
                    None | Some("" | "0") => None,
                    Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
                        Error::BadRequest(format!("invalid resourceVersion {rv:?}"))
                    })?),
                };
            let spec = store::WatchSpec {
                kind,
                namespace: ns.map(str::to_string),
                selector: query.selector()?,
            };
            let options = super::watch::Options {
                timeout_seconds: query
                    .get("timeoutSeconds")
                    .and_then(|t| t.parse::<u64>().ok()),
                bookmarks: query.flag("allowWatchBookmarks"),
                initial_events: query.flag("sendInitialEvents"),
                metadata,
            };
            // sendInitialEvents lists the current state first, whatever the version asked.
            let since = if options.initial_events { None } else { since };
            Ok(super::watch::respond(server, spec, since, options))
        }
        (Method::GET, None) => {
            let limit = query
                .get("limit")
                .and_then(|l| l.parse::<usize>().ok())
                .filter(|l| *l > 0);
            let token = query.get("continue").filter(|t| !t.is_empty());
            let page = server
                .store()
                .list(kind, ns, &query.selector()?, limit, token)?;
            Ok(list_response(kind, &page, metadata))
        }
        (Method::POST, None) => {
            let obj = read_body(req).await?;
            let created = server.store().create(kind, ns, obj, query.dry_run())?;
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (Method::PUT, Some(name)) => {
            let obj = read_body(req).await?;
            let updated =
                server
                    .store()
                    .update(kind, ns, name, obj, target.status, query.dry_run())?;
            ok(&updated)
        }
        (Method::PATCH, Some(name)) => {
            let content_type = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            let body = read_body(req).await?;
            let mut store = server.store();
            let current = store.get(kind, store_ns, name);
            let (created, patched) = match (content_type.as_str(), current) {
                ("application/apply-patch+yaml", None) if !target.status => {
                    // Server-side apply creates what does not exist yet.
                    let mut obj = body;
                    if obj.pointer("/metadata/name").is_none() {
                        obj["metadata"]["name"] = Value::from(name);
                    }
                    (true, store.create(kind, ns, obj, query.dry_run())?)
                }
                (_, None) => {
                    return Err(Error::NotFound {
                        kind: k.qualified(),
                        name: name.into(),
                    });
                }
                (ct, Some(current)) => {
                    let mut obj = (*current).clone();
                    match ct {
                        "application/merge-patch+json" => patch::merge(&mut obj, &body),
                        "application/json-patch+json" => patch::json_patch(&mut obj, &body)?,
                        "application/strategic-merge-patch+json"
                        | "application/apply-patch+yaml" => patch::strategic(&mut obj, &body),
                        other => {
                            return Ok(unsupported_media(other));
                        }
                    }
                    // A patch that does not name a resourceVersion applies to the stored one.
                    if body.pointer("/metadata/resourceVersion").is_none()
                        && ct != "application/json-patch+json"
                    {
                        obj["metadata"]["resourceVersion"] =
                            current["metadata"]["resourceVersion"].clone();
                    }
                    (
                        false,
                        store.update(kind, ns, name, obj, target.status, query.dry_run())?,
                    )
                }
            };
            Ok(json_response(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                &patched,
            ))
        }
        (Method::DELETE, None) => {
            // deletecollection: every object the selectors match, returned as a list.
            let mut store = server.store();
            let selector = query.selector()?;
            let doomed: Vec<(String, String)> = store
                .objects(kind, ns)
                .into_iter()
                .filter(|o| selector.matches(o))
                .map(|o| {
                    (
                        store::namespace_of(&o).to_string(),
                        store::name_of(&o).to_string(),
                    )
                })
                .collect();
            let mut items = Vec::new();
            for (ns, name) in doomed {
                items.push(store.delete(kind, &ns, &name, query.dry_run())?);
            }
            let page = Page {
                rv: store.rv(),
                items,
                continue_token: None,
                remaining: 0,
            };
            Ok(list_response(kind, &page, false))
        }
        (Method::DELETE, Some(name)) => {
            // DeleteOptions may carry preconditions (Cilium deletes CiliumEndpoints by uid).
            let options = read_body(req).await.unwrap_or(Value::Null);
            let mut store = server.store();
            if let Some(current) = store.get(kind, store_ns, name) {
                for field in ["uid", "resourceVersion"] {
                    let want = options
                        .pointer(&format!("/preconditions/{field}"))
                        .and_then(Value::as_str);
                    let have = current
                        .pointer(&format!("/metadata/{field}"))
                        .and_then(Value::as_str);
                    if want.is_some_and(|w| Some(w) != have) {
                        return Err(Error::Conflict {
                            kind: k.qualified(),
                            name: name.into(),
                        });
                    }
                }
            }
            let deleted = store.delete(kind, store_ns, name, query.dry_run())?;
            ok(&deleted)
        }
        _ => Err(Error::MethodNotAllowed),
    }
}

/// 415 with a `Status` naming the media type, as the real server answers.
fn unsupported_media(content_type: &str) -> Response<Body> {
    let error = Error::BadRequest(format!(
        "the body of the request was in an unknown format: {content_type}"
    ));
    let mut status = error.status();
    status["code"] = Value::from(415);
    status["reason"] = Value::from("UnsupportedMediaType");
    json_response(StatusCode::UNSUPPORTED_MEDIA_TYPE, &status)
}

/// Serializes a LIST page without copying the stored objects into a new tree.
fn list_response(kind: usize, page: &Page, metadata: bool) -> Response<Body> {
    let k = &KINDS[kind];
    let (list_kind, api_version) = if metadata {
        (
            "PartialObjectMetadataList".to_string(),
            "meta.k8s.io/v1".to_string(),
        )
    } else {
        (format!("{}List", k.kind), k.api_version())
    };
    let mut out = Vec::with_capacity(256 + page.items.len() * 1024);
    let mut meta = serde_json::json!({ "resourceVersion": page.rv.to_string() });
    if let Some(token) = &page.continue_token {
        meta["continue"] = Value::from(token.as_str());
        meta["remainingItemCount"] = Value::from(page.remaining);
    }
    let _ = write!(
        out,
        "{{\"kind\":\"{list_kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{meta},\"items\":["
    );
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = if metadata {
            serde_json::to_writer(&mut out, &super::metadata_only(item))
        } else {
            serde_json::to_writer(&mut out, &**item)
        };
    }
    out.extend_from_slice(b"]}");
    bytes_response(StatusCode::OK, "application/json", out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse() {
        let t = parse_target(
            "",
            "v1",
            &["namespaces", "default", "pods", "web", "status"],
        )
        .unwrap();
        assert_eq!(
            (t.namespace, t.name, t.status),
            (Some("default"), Some("web"), true)
        );
        assert_eq!(KINDS[t.kind].kind, "Pod");
        let t = parse_target("", "v1", &["namespaces", "default"]).unwrap();
        assert_eq!(
            (KINDS[t.kind].kind, t.namespace, t.name),
            ("Namespace", None, Some("default"))
        );
        let t = parse_target("", "v1", &["namespaces", "default", "status"]).unwrap();
        assert!(t.status);
        let t = parse_target("cilium.io", "v2", &["ciliumnodes", "n1"]).unwrap();
        assert_eq!(KINDS[t.kind].kind, "CiliumNode");
        assert!(parse_target("cilium.io", "v2", &["namespaces", "x", "ciliumnodes"]).is_err());
        assert!(parse_target("cilium.io", "v2", &["ciliumendpoints", "x", "status"]).is_err());
        assert!(parse_target("", "v1", &["endpoints"]).is_err());
    }
}
