//! The cost of a new identity for the policy repository, in process: the identity taken from
//! the identity table and handed to the repository, whose selector cache tests it against each
//! cached selector (and drops the resolved policies, which the new revision outdates).
//!
//! Baseline, in the same run: the same identity taken, then every cached selector's set
//! recomputed from scratch over every identity, as a cache without incremental updates would.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cellium_identity::Identities;
use cellium_labels::{Labels, Selector};
use cellium_policy_repo::{PolicyRepository, Subject};
use cellium_resources::{ObjectKey, Resources};

use cellium_integration::bench::{Shape, interrupted};

/// What was measured.
#[derive(Debug)]
pub struct IdentityAdd {
    /// Cached selectors, and how many of them select each new identity.
    pub selectors: usize,
    /// How many selectors select each new identity.
    pub matching: usize,
    /// Allow and deny rules in the repository.
    pub rules: usize,
    /// Identities known before the new ones.
    pub identities: usize,
    /// Time per new identity, incremental (the repository), each sample.
    pub incremental: Vec<Duration>,
    /// Time per new identity, recomputing every selector, each sample.
    pub naive: Vec<Duration>,
    /// Time to resolve every pod's policy after a new revision, each sample.
    pub resolve_all: Vec<Duration>,
}

fn pod_labels(resources: &Resources, ns: &str, name: &str) -> Result<Labels> {
    let pod = resources
        .pods
        .get(&ObjectKey::namespaced(ns, name))
        .with_context(|| format!("no pod {ns}/{name}"))?;
    let ns_labels = resources
        .namespaces
        .get(&ObjectKey::cluster(ns))
        .map(|n| n.labels.clone())
        .unwrap_or_default();
    Ok(Labels::for_pod(ns, &pod.labels, &ns_labels))
}

/// Builds the repository of `shape` and adds `samples` new identities of pods of `ns-0`
/// (which the hundred namespace selectors select).
pub fn measure(shape: Shape, samples: usize) -> Result<IdentityAdd> {
    let resources = Resources::new();
    resources.apply("namespaces.yaml", &shape.namespaces_yaml())?;
    resources.apply("pods.yaml", &shape.pods_yaml())?;
    resources.apply("policies.yaml", &shape.policies_yaml())?;
    let ids = Identities::in_memory();
    let mut subjects = Vec::new();
    for i in 0..shape.pods {
        let key = shape.pod_key(i);
        let (ns, name) = key.split_once('/').context("pod key")?;
        let labels = pod_labels(&resources, ns, name)?;
        let id = ids.allocate(&labels)?;
        subjects.push((id.id, labels));
    }
    let repo = PolicyRepository::with_parts(ids.clone(), None, None);
    let (snapshot, _) = ids.snapshot_and_subscribe();
    repo.sync_identities(&snapshot);
    repo.sync_resources(&resources);
    let rules = repo.rules().iter().filter(|r| r.verdict.is_some()).count();
    let cached: Vec<Selector> = repo
        .selectors()
        .iter()
        .map(|s| s.selector.parse())
        .collect::<Result<_, _>>()
        .context("a cached selector's text does not parse back")?;
    let mut known: BTreeMap<u32, Labels> = ids
        .list()
        .into_iter()
        .map(|i| (i.identity.id, i.identity.labels.clone()))
        .collect();
    let identities = known.len();
    let ns0 = resources
        .namespaces
        .get(&ObjectKey::cluster("ns-0"))
        .map(|n| n.labels.clone())
        .unwrap_or_default();

    let mut out = IdentityAdd {
        selectors: cached.len(),
        matching: 0,
        rules,
        identities,
        incremental: Vec::new(),
        naive: Vec::new(),
        resolve_all: Vec::new(),
    };
    for k in 0..samples {
        interrupted()?;
        // Every endpoint's policy resolved, as in a running agent: the new revision drops them.
        let began = Instant::now();
        for (id, labels) in &subjects {
            repo.resolve(&Subject {
                identity: *id,
                labels,
                named_ports: &[],
            });
        }
        out.resolve_all.push(began.elapsed());
        let new = |tag: &str| {
            let pod = BTreeMap::from([
                ("app".to_string(), format!("new-{tag}-{k}")),
                ("group".to_string(), "g-0".to_string()),
                ("tier".to_string(), "t-new".to_string()),
            ]);
            Labels::for_pod("ns-0", &pod, &ns0)
        };

        let labels = new("incremental");
        let began = Instant::now();
        let identity = ids.allocate(&labels)?;
        repo.identity_added(&identity);
        out.incremental.push(began.elapsed());
        known.insert(identity.id, identity.labels.clone());
        out.matching = repo
            .selectors()
            .iter()
            .filter(|s| s.identities.contains(&identity.id))
            .count();

        let labels = new("naive");
        let began = Instant::now();
        let identity = ids.allocate(&labels)?;
        known.insert(identity.id, identity.labels.clone());
        let sets: Vec<BTreeSet<u32>> = cached
            .iter()
            .map(|s| {
                known
                    .iter()
                    .filter(|(_, l)| s.matches(l))
                    .map(|(id, _)| *id)
                    .collect()
            })
            .collect();
        out.naive.push(began.elapsed());
        let naive_matching = sets.iter().filter(|s| s.contains(&identity.id)).count();
        if naive_matching != out.matching {
            bail!(
                "the repository selects the new identity with {} selectors, a full recomputation with {naive_matching}",
                out.matching
            );
        }
    }
    Ok(out)
}
