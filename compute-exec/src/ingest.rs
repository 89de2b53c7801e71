//! Sharded ingest: one dataset version spread over every storage node,
//! committed on all of them or on none (the coordinator's half of
//! `sluice_flight::ingest`).
//!
//! The source is cut by position: node `i` of `n` (in the order the
//! coordinator knows them) takes every `n`-th object of the sorted source
//! from the `i`-th (`Shard`). That balances sample counts within one and
//! keeps each node's part independent of the others' (no node reads what
//! it does not keep); it does not balance bytes when object sizes are
//! skewed. Shard files (WebDataset, TFRecord, Parquet with the images
//! inside), at least `n` of them, are cut by file instead: node `i` reads
//! every `n`-th file and no other (`storage-exec`'s `shard_files`). A
//! query or job over the `n` parts returns what one data dir holding the
//! whole source returns.
//!
//! 1. Every node prepares its part at once, under one transaction id.
//! 2. If any fails (a bad source, a full device, a node that dies or
//!    cannot be reached), every node is told to drop its part — those that
//!    prepared one free it, the others never had one — and the error names
//!    the node at fault. No version appears anywhere.
//! 3. Otherwise every part is committed. A node lost between the first and
//!    the last commit (milliseconds: one catalog transaction each) leaves
//!    the parts already committed visible; that is reported as
//!    [`IngestError::Partial`], naming the nodes on each side, and a
//!    node's uncommitted part is dropped by its time to live.
//!
//! One sharded ingest runs at a time per coordinator: two at once could
//! each hold a node's ingest lock the other waits for.

use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use serde::Serialize;
use sluice_base::Fault;
use sluice_flight::ingest::{IngestPart, SkippedObject};
use sluice_flight::{LinkError, StorageEndpoint};
use tonic::Code;

/// What to ingest: a source on a filesystem every storage node sees at
/// the same path.
#[derive(Debug, Clone)]
pub struct IngestRequest {
    /// The dataset (a new version on every node).
    pub dataset: String,
    /// The source directory or manifest.
    pub path: String,
    /// A manifest under `path`.
    pub manifest: Option<String>,
    /// Unreadable objects: `skip` or `fail`.
    pub on_error: String,
    /// How many nodes hold each part; `None`: 2 with at least 2 nodes,
    /// else 1.
    pub replicas: Option<u32>,
}

impl IngestRequest {
    /// The replicas it asks for over `nodes` storage nodes (or the
    /// default); `Err`: what it asks, which does not fit.
    fn replicas_over(&self, nodes: usize) -> Result<u32, u32> {
        let replicas = self.replicas.unwrap_or_else(|| default_replicas(nodes));
        match replicas == 0 || replicas as usize > nodes {
            true => Err(replicas),
            false => Ok(replicas),
        }
    }

    /// Node `i` of `n`'s part of it, under transaction `txn`.
    fn part(&self, txn: &str, i: u32, n: u32, replicas: u32) -> IngestPart {
        IngestPart {
            txn: txn.to_string(),
            dataset: self.dataset.clone(),
            path: self.path.clone(),
            manifest: self.manifest.clone(),
            on_error: self.on_error.clone(),
            // Every node of n holding n parts is the whole source.
            shard: (n > replicas).then_some((i, n)),
            replicas,
        }
    }
}

/// Each part's holders (node names) over `nodes` with `replicas` copies.
fn holders(nodes: &[Arc<dyn StorageEndpoint>], replicas: u32) -> Vec<Vec<String>> {
    let n = nodes.len() as u32;
    (0..n)
        .map(|p| {
            sluice_flight::ingest::holders(p, n, replicas)
                .map(|i| nodes[i as usize].name().to_string())
                .collect()
        })
        .collect()
}

/// Replicas when none is asked for: 2 with at least 2 storage nodes.
pub fn default_replicas(nodes: usize) -> u32 {
    if nodes >= 2 { 2 } else { 1 }
}

/// One node's committed part.
#[derive(Debug, Clone, Serialize)]
pub struct PartReport {
    /// The storage node.
    pub node: String,
    /// The version on that node.
    pub version: u64,
    /// Samples in its part.
    pub samples: u64,
    /// Bytes of their objects.
    pub bytes: u64,
}

/// A committed sharded ingest.
#[derive(Debug, Clone, Serialize)]
pub struct ShardedReport {
    /// The dataset.
    pub dataset: String,
    /// Samples in the dataset (each once, however many replicas).
    pub samples: u64,
    /// Bytes of their objects (each once).
    pub bytes: u64,
    /// Bytes written over every node: `bytes` × replicas.
    pub stored_bytes: u64,
    /// Device chunks over every node.
    pub chunks: u64,
    /// How many nodes hold each part.
    pub replicas: u32,
    /// Part `p`'s holders (node names), first the one it is named after.
    pub holders: Vec<Vec<String>>,
    /// Objects left out (each once, on whichever node refused it).
    pub skipped: Vec<SkippedObject>,
    /// Wall time, seconds.
    pub seconds: f64,
    /// What each node committed, in shard order: its `replicas` parts.
    pub parts: Vec<PartReport>,
}

/// Why a sharded ingest committed nothing (or, rarely, not everything).
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// No storage node is known.
    #[error("no storage node to ingest into (start one, or give serve --storage)")]
    NoStorageNodes,
    /// More replicas than nodes (or none).
    #[error(
        "replicas {asked}: each part goes to distinct storage nodes, and there are {nodes}; \
         ask for 1 to {nodes}"
    )]
    Replicas {
        /// What was asked.
        asked: u32,
        /// Storage nodes known.
        nodes: usize,
    },
    /// A node could not prepare its part; every part was dropped.
    #[error("{source}; the ingest was abandoned on every node, no version was committed")]
    Part {
        /// The node's error (it names the node).
        #[source]
        source: LinkError,
    },
    /// Some nodes committed, then one could not: the parts committed stay.
    #[error(
        "version committed on {committed:?} but not on {failed} ({source}): the dataset's \
         latest versions now differ in content; ingest it again"
    )]
    Partial {
        /// Nodes whose part is committed.
        committed: Vec<String>,
        /// The node that could not commit.
        failed: String,
        /// Its error.
        #[source]
        source: LinkError,
    },
}

impl Fault for IngestError {
    fn code(&self) -> Code {
        match self {
            Self::NoStorageNodes => Code::FailedPrecondition,
            Self::Replicas { .. } => Code::InvalidArgument,
            Self::Part { source } => source.code(),
            Self::Partial { .. } => Code::Internal,
        }
    }

    fn kind(&self) -> &str {
        match self {
            Self::NoStorageNodes => "no_storage_nodes",
            Self::Replicas { .. } => "bad_replicas",
            Self::Part { source } => source.kind(),
            Self::Partial { .. } => "partial_commit",
        }
    }
}

/// Serializes sharded ingests (see the module docs).
#[derive(Debug, Default)]
pub struct Ingests {
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl Ingests {
    /// Holds off every sharded ingest until dropped: for what else takes
    /// the storage nodes' ingest locks (`crate::moves`).
    pub async fn exclusive(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.one_at_a_time.lock().await
    }

    /// Ingests `req` over `nodes` (see the module docs).
    pub async fn run(
        &self,
        nodes: &[Arc<dyn StorageEndpoint>],
        req: &IngestRequest,
    ) -> Result<ShardedReport, IngestError> {
        if nodes.is_empty() {
            return Err(IngestError::NoStorageNodes);
        }
        let replicas = req
            .replicas_over(nodes.len())
            .map_err(|asked| IngestError::Replicas {
                asked,
                nodes: nodes.len(),
            })?;
        let _one = self.one_at_a_time.lock().await;
        let started = Instant::now();
        let txn = txn_id(&req.dataset);
        let n = nodes.len() as u32;
        let parts: Vec<IngestPart> = (0..n).map(|i| req.part(&txn, i, n, replicas)).collect();
        let prepared = join_all(
            nodes
                .iter()
                .zip(&parts)
                .map(|(node, part)| async move { node.prepare_ingest(part).await }),
        )
        .await;
        if let Some(source) = prepared.into_iter().find_map(Result::err) {
            // Every node is told, prepared or not: a node whose reply was
            // lost may hold a part all the same.
            join_all(nodes.iter().map(|node| {
                let txn = &txn;
                async move {
                    if let Err(e) = node.finish_ingest(txn, false).await {
                        tracing::warn!(
                            "ingest {txn}: cannot drop the part on {}: {e}",
                            node.name()
                        );
                    }
                }
            }))
            .await;
            return Err(IngestError::Part { source });
        }
        let mut committed = Vec::with_capacity(nodes.len());
        let mut report = ShardedReport {
            dataset: req.dataset.clone(),
            samples: 0,
            bytes: 0,
            stored_bytes: 0,
            chunks: 0,
            replicas,
            holders: holders(nodes, replicas),
            skipped: Vec::new(),
            seconds: 0.0,
            parts: Vec::with_capacity(nodes.len()),
        };
        for node in nodes {
            let done = match node.finish_ingest(&txn, true).await {
                Ok(Some(done)) => done,
                Ok(None) => {
                    let source = LinkError::Protocol(format!(
                        "{} answered a commit with nothing",
                        node.name()
                    ));
                    return Err(self.partial(nodes, &txn, committed, node, source).await);
                }
                Err(source) => {
                    return Err(self.partial(nodes, &txn, committed, node, source).await);
                }
            };
            committed.push(node.name().to_string());
            report.samples += done.samples;
            report.stored_bytes += done.bytes;
            report.chunks += done.chunks;
            for s in done.skipped {
                if !report.skipped.iter().any(|k| k.key == s.key) {
                    report.skipped.push(s);
                }
            }
            report.parts.push(PartReport {
                node: node.name().to_string(),
                version: done.version,
                samples: done.samples,
                bytes: done.bytes,
            });
        }
        // Every part is on exactly `replicas` nodes.
        report.samples /= u64::from(replicas);
        report.bytes = report.stored_bytes / u64::from(replicas);
        report.seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            "ingested {} ({} samples) over {} storage node(s), {replicas} replica(s) of each part",
            report.dataset,
            report.samples,
            nodes.len()
        );
        Ok(report)
    }

    /// A commit failed on `failed` after `committed`: the nodes not yet
    /// committed are told to drop their parts, and the error says which
    /// side each node is on.
    async fn partial(
        &self,
        nodes: &[Arc<dyn StorageEndpoint>],
        txn: &str,
        committed: Vec<String>,
        failed: &Arc<dyn StorageEndpoint>,
        source: LinkError,
    ) -> IngestError {
        for node in nodes
            .iter()
            .filter(|n| !committed.iter().any(|c| c == n.name()))
        {
            let _ = node.finish_ingest(txn, false).await;
        }
        if committed.is_empty() {
            return IngestError::Part { source };
        }
        tracing::error!(
            "ingest {txn}: committed on {committed:?}, not on {}: {source}",
            failed.name()
        );
        IngestError::Partial {
            committed,
            failed: failed.name().to_string(),
            source,
        }
    }
}

/// A transaction id no other ingest (or move) of this coordinator shares.
pub(crate) fn txn_id(dataset: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{dataset}-{nanos:x}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
