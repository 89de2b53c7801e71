//! The storage nodes a session reads: given at start, registered with the
//! coordinator ([`ComputeSession::admit`]), or learnt from it
//! ([`ComputeSession::add_endpoint`]); taken out by an operator
//! ([`ComputeSession::remove_endpoint`]); and refreshed — every node
//! asked at once, each within [`NODE_ANSWER`], for what it holds — so that
//! a node never seen alive blocks no query that does not need it.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::common::Result;
use sluice_flight::{LinkError, NodeInfo, RemoteDataset, StorageEndpoint};

use super::{ComputeSession, Holding, NODE_ANSWER, Part};

impl ComputeSession {
    /// The storage nodes read now (those removed left out).
    pub fn endpoints(&self) -> Vec<Arc<dyn StorageEndpoint>> {
        let removed = self.removed.read().unwrap_or_else(|e| e.into_inner());
        self.indexed()
            .into_iter()
            .filter(|e| !removed.contains(e.name()))
            .collect()
    }

    /// Every storage node ever known, by index (what [`Known`] records).
    pub(super) fn indexed(&self) -> Vec<Arc<dyn StorageEndpoint>> {
        self.endpoints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether the node `e` is removed.
    pub(super) fn is_removed(&self, e: &Arc<dyn StorageEndpoint>) -> bool {
        self.removed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(e.name())
    }

    /// Admits a storage node that registered and passed the ledger's
    /// check: read from now on, each of its parts at the version the
    /// ledger names. Whether it was new.
    pub fn admit(&self, endpoint: Arc<dyn StorageEndpoint>) -> bool {
        let name = endpoint.name().to_string();
        self.checked
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone());
        let returned = self
            .removed
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&name);
        self.add_endpoint(endpoint) || returned
    }

    /// Stops reading the storage node `name` (a node lost for good, or
    /// taken out): queries and new jobs no longer wait for it. Whether it
    /// was read.
    pub fn remove_endpoint(&self, name: &str) -> bool {
        let known = self.indexed().iter().any(|e| e.name() == name);
        known
            && self
                .removed
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name.to_string())
    }

    /// Adds a storage node that registered (`sluice storage-node
    /// --coordinator`), unless one of that name is known: whether it was
    /// new. Its datasets are listed at the next refresh; the next ingest
    /// spreads over it.
    pub fn add_endpoint(&self, endpoint: Arc<dyn StorageEndpoint>) -> bool {
        let mut endpoints = self.endpoints.write().unwrap_or_else(|e| e.into_inner());
        if endpoints.iter().any(|e| e.name() == endpoint.name()) {
            return false;
        }
        tracing::info!("storage node {} registered", endpoint.name());
        endpoints.push(endpoint);
        true
    }

    /// Asks every node for its datasets (and, the first time, its cores),
    /// all at once and each for at most [`NODE_ANSWER`]: one node that is
    /// down costs a refresh that long, not a connect timeout per node. A
    /// node that does not answer keeps what it said last; its datasets
    /// fail when a query needs them, with an error naming it. A node that
    /// registered is read only at the versions the ledger names.
    pub async fn refresh(&self) -> Result<(), LinkError> {
        let mut known = self.known.lock().await;
        let mut reached = 0;
        let mut last_err = None;
        let mut listed: BTreeMap<String, Holding> = BTreeMap::new();
        let endpoints = self.indexed();
        let checked = self
            .checked
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let asked = endpoints.iter().enumerate().map(|(i, e)| {
            let first = !known.cores.contains_key(&i);
            let live = !self.is_removed(e);
            async move {
                if live {
                    Some(ask(e, first).await)
                } else {
                    None
                }
            }
        });
        let answers = futures::future::join_all(asked).await;
        known.unreachable.clear();
        for ((i, e), answer) in endpoints.iter().enumerate().zip(answers) {
            let Some(answer) = answer else { continue };
            let datasets = match answer {
                Ok((info, d)) => {
                    if let Some(info) = info {
                        known.cores.insert(i, info.cores);
                        known.limits.insert(i, info.link_limit);
                    }
                    d
                }
                Err(err) => {
                    tracing::warn!("{err}");
                    known.unreachable.insert(i);
                    for (name, h) in &known.datasets {
                        if self.moved_away(name, e.name()) {
                            continue;
                        }
                        if let Some(p) = h.parts.iter().find(|p| p.node == i) {
                            listed
                                .entry(name.clone())
                                .or_insert_with(|| Holding {
                                    schema: Arc::clone(&h.schema),
                                    parts: vec![],
                                })
                                .parts
                                .push(p.clone());
                        }
                    }
                    last_err = Some(err);
                    continue;
                }
            };
            reached += 1;
            let registered = checked.contains(e.name());
            for d in datasets {
                let Some(version) = self.version_to_read(registered, e.name(), &d) else {
                    continue;
                };
                let h = listed.entry(d.name.clone()).or_insert_with(|| Holding {
                    schema: Arc::clone(&d.schema),
                    parts: vec![],
                });
                if h.schema.fields() != d.schema.fields() {
                    tracing::warn!(
                        "dataset {} on {} has another schema than on other nodes; ignoring that part",
                        d.name,
                        e.name()
                    );
                    continue;
                }
                h.parts.push(Part {
                    node: i,
                    version,
                    stats: d.stats,
                });
            }
        }
        known.datasets = listed;
        match last_err {
            Some(e) if reached == 0 && !endpoints.is_empty() => Err(e),
            _ => Ok(()),
        }
    }

    /// Whether `dataset`'s layout no longer names `node`: its parts moved
    /// to other nodes (`crate::moves`), and what it still holds is not read.
    fn moved_away(&self, dataset: &str, node: &str) -> bool {
        self.ledger
            .layout(dataset)
            .is_some_and(|l| !l.versions.contains_key(node))
    }

    /// The version of `d` to read on `node`: the one it lists, or, for a
    /// node that `registered`, the one the ledger names there (`None`: the
    /// cluster never wrote it there, and it is not read). A node the
    /// dataset's layout no longer names (its parts moved away, its copy
    /// waiting to be retired) is not read either.
    fn version_to_read(&self, registered: bool, node: &str, d: &RemoteDataset) -> Option<u64> {
        if self.moved_away(&d.name, node) {
            tracing::debug!("{} on {node}: its parts moved elsewhere; not read", d.name);
            return None;
        }
        if !registered {
            return Some(d.version);
        }
        let version = self.ledger.version(&d.name, node);
        if version.is_none() {
            tracing::warn!(
                "storage node {node} holds dataset {}, which this cluster never wrote there: \
                 not read",
                d.name
            );
        }
        version
    }
}

/// A node's answer to a refresh: its information (asked the `first` time
/// only) and its datasets, within [`NODE_ANSWER`].
async fn ask(
    e: &Arc<dyn StorageEndpoint>,
    first: bool,
) -> Result<(Option<NodeInfo>, Vec<RemoteDataset>), LinkError> {
    let answer = async {
        let info = if first {
            Some(e.node_info().await?)
        } else {
            None
        };
        Ok::<_, LinkError>((info, e.datasets().await?))
    };
    tokio::time::timeout(NODE_ANSWER, answer)
        .await
        .unwrap_or_else(|_| {
            Err(LinkError::Unavailable {
                node: e.name().to_string(),
                reason: format!("no answer within {} s", NODE_ANSWER.as_secs_f64()),
            })
        })
}
