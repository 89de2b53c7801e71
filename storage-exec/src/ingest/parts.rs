//! A storage node's side of an ingest spread over several nodes
//! (`sluice_flight::ingest`): it prepares its part of the source beneath
//! its own ingest roots (or, for an object store's URL, beneath its own
//! `--ingest-url-allow`, reading its part from the store itself: the bytes
//! never pass through the coordinator), holds it uncommitted, and commits
//! or drops it on its coordinator's word.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_flight::ingest::{IngestPart, IngestedPart, PreparedPart, SkippedObject};

use super::objects::{ObjectUrl, UrlAllow};
use super::{Confinement, IngestOptions, IngestSource, NodeShare, OnError, prepare};
use crate::error::{Result, StorageError};
use crate::node::StorageNode;

impl StorageNode {
    /// Lets coordinators send this node ingests of sources beneath
    /// `roots` (each an existing directory) and beneath the object-store
    /// prefixes `urls` (set once). Without it the node refuses every
    /// ingest.
    pub fn allow_ingest(&self, roots: &[PathBuf], urls: &[String]) -> Result<()> {
        let confinement = Arc::new(Confinement::new(roots)?);
        let allow = UrlAllow::new(urls)?;
        let set = self.ingest_roots.set(confinement).is_ok() && self.ingest_urls.set(allow).is_ok();
        if set {
            Ok(())
        } else {
            Err(StorageError::BadSource {
                path: PathBuf::from("--ingest-root"),
                reason: "this node's ingest roots are already set".into(),
            })
        }
    }

    /// The source of `part`: beneath this node's object-store prefixes
    /// when it is a URL (this node reads its own part from the store),
    /// else beneath its roots.
    fn part_source(&self, part: &IngestPart) -> Result<(IngestSource, Option<Arc<Confinement>>)> {
        if ObjectUrl::is_url(&part.path) {
            let allow = self.ingest_urls.get().cloned().unwrap_or_default();
            let source =
                IngestSource::from_arg(&part.path, part.manifest.as_deref(), Some(&allow))?;
            return Ok((source, None));
        }
        let Some(confine) = self.ingest_roots.get().filter(|c| !c.is_empty()) else {
            return Err(StorageError::OutsideRoots {
                path: PathBuf::from(&part.path),
                roots: "none: start the storage node with --ingest-root DIR".into(),
            });
        };
        let path = confine.admit(Path::new(&part.path))?;
        let manifest = match &part.manifest {
            Some(m) => Some(confine.admit(&path.join(m))?),
            None => None,
        };
        let source = IngestSource::from_cli(&path, manifest.as_deref());
        Ok((source, Some(Arc::clone(confine))))
    }

    /// Prepares this node's part of an ingest (see `sluice_flight::ingest`).
    pub async fn prepare_part(&self, part: &IngestPart) -> Result<PreparedPart> {
        let (source, confine) = self.part_source(part)?;
        let path = PathBuf::from(&part.path);
        let on_error: OnError =
            OnError::parse_ingest(&part.on_error).map_err(|reason: String| {
                StorageError::BadSource {
                    path: path.clone(),
                    reason,
                }
            })?;
        let shard = match part.shard {
            None => None,
            Some((index, count)) => match NodeShare::new(index, count, part.replicas) {
                Ok(s) => Some(s),
                Err(reason) => return Err(StorageError::BadSource { path, reason }),
            },
        };
        let opts = IngestOptions {
            confine,
            shard,
            ..IngestOptions::with_policy(on_error)
        };
        let prepared = prepare(self.store(), &part.dataset, source, opts).await?;
        let out = prepared.part();
        tracing::info!(
            "ingest {}: prepared {} version {} ({} samples) from {}",
            part.txn,
            part.dataset,
            out.version,
            out.samples,
            part.path
        );
        self.pending.hold(&part.txn, prepared)?;
        Ok(out)
    }

    /// Commits the part prepared under `txn` (its report), or drops it
    /// (`None`; dropping a part this node does not hold is no error: it
    /// may never have been prepared).
    pub async fn finish_part(&self, txn: &str, commit: bool) -> Result<Option<IngestedPart>> {
        let part = self.pending.take(txn);
        if !commit {
            if part.is_some() {
                tracing::info!("ingest {txn}: dropped on its coordinator's word");
            }
            return Ok(None);
        }
        let Some(part) = part else {
            return Err(StorageError::UnknownIngest(txn.to_string()));
        };
        // One catalog transaction, with its fsync: off the async workers.
        let report = tokio::task::spawn_blocking(move || part.commit())
            .await
            .map_err(|e| StorageError::io("commit", ".", std::io::Error::other(e)))??;
        tracing::info!(
            "ingest {txn}: committed {} version {}",
            report.dataset,
            report.version
        );
        Ok(Some(IngestedPart {
            dataset: report.dataset,
            version: report.version,
            samples: report.samples,
            bytes: report.bytes,
            chunks: report.chunks,
            skipped: report
                .skipped
                .into_iter()
                .map(|s| SkippedObject {
                    key: s.key,
                    reason: s.reason,
                })
                .collect(),
            seconds: report.seconds,
        }))
    }
}
