//! [`NodeCheckpoints`]: one storage node's checkpoint protocol, as a
//! coordinator calls it to keep the stripes of a cluster's checkpoints
//! there. Every error names the node.
//!
//! The node is dialled over a few connections, taken in turn: streams
//! that share an HTTP/2 connection are served a frame at a time, and a
//! coordinator moves several stripes to one node at once.

use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::buffer::Buffer;
use arrow_flight::{Action, FlightDescriptor};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::data::{self, Encoded, PieceError};
use super::scrub::{CheckpointScrub, RepairExtent, RepairedExtent, ScrubCheckpoints};
use super::{CheckpointInfo, GetTicket, PutCommand};
use crate::credential::Credential;
use crate::error::LinkError;
use crate::link::Link;
use crate::ticket::Ticket;

/// See the module docs.
#[derive(Debug)]
pub struct NodeCheckpoints {
    links: Vec<Link>,
    next: AtomicUsize,
}

impl NodeCheckpoints {
    /// The node at `url`, dialled over `lanes` connections (at least one)
    /// presenting `credential`. Nothing is dialled until the first call.
    pub fn connect(url: &str, credential: Credential, lanes: usize) -> Result<Self, LinkError> {
        let links = (0..lanes.max(1))
            .map(|_| Link::connect(url, credential.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            links,
            next: AtomicUsize::new(0),
        })
    }

    /// The node's name (the URL it is dialled at).
    pub fn name(&self) -> &str {
        &self.links[0].node
    }

    fn link(&self) -> &Link {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.links[i % self.links.len()]
    }

    async fn action<T: DeserializeOwned>(
        &self,
        kind: &str,
        body: &impl Serialize,
    ) -> Result<T, LinkError> {
        let link = self.link();
        let body = serde_json::to_vec(body).map_err(|e| LinkError::Protocol(e.to_string()))?;
        let action = Action {
            r#type: kind.into(),
            body: body.into(),
        };
        let mut replies = link
            .inner
            .clone()
            .do_action(action)
            .await
            .map_err(|s| link.status(&s))?
            .into_inner();
        let reply = replies
            .message()
            .await
            .map_err(|s| link.status(&s))?
            .ok_or_else(|| {
                LinkError::Protocol(format!("{} answered {kind} with nothing", link.node))
            })?;
        serde_json::from_slice(&reply.body)
            .map_err(|e| LinkError::Protocol(format!("{} sent a bad {kind} reply: {e}", link.node)))
    }

    /// Starts a version of `name` there; its upload id.
    pub async fn begin(&self, name: &str) -> Result<String, LinkError> {
        #[derive(serde::Deserialize)]
        struct Begun {
            upload: String,
        }
        let b: Begun = self
            .action("checkpoint.begin", &json!({ "name": name }))
            .await?;
        Ok(b.upload)
    }

    /// Starts a version of `name` there with an upload pass (for a
    /// trainer to write its parts directly); its upload id, and the pass
    /// where the node gives one.
    pub async fn begin_with_pass(&self, name: &str) -> Result<(String, Option<String>), LinkError> {
        #[derive(serde::Deserialize)]
        struct Begun {
            upload: String,
            #[serde(default)]
            pass: Option<String>,
        }
        let b: Begun = self
            .action("checkpoint.begin", &json!({ "name": name, "pass": true }))
            .await?;
        Ok((b.upload, b.pass))
    }

    /// A pass that reads version `version` of `name` there with no token
    /// (`sluice_access::read_pass`); none where the node gives none.
    pub async fn read_pass(&self, name: &str, version: u64) -> Result<Option<String>, LinkError> {
        #[derive(serde::Deserialize)]
        struct Pass {
            #[serde(default)]
            pass: Option<String>,
        }
        let p: Pass = self
            .action(
                "checkpoint.read_pass",
                &json!({ "name": name, "version": version }),
            )
            .await?;
        Ok(p.pass)
    }

    /// Those of `uploads` still open there.
    pub async fn open_uploads(&self, uploads: &[String]) -> Result<Vec<String>, LinkError> {
        #[derive(serde::Deserialize)]
        struct Open {
            open: Vec<String>,
        }
        let o: Open = self
            .action("checkpoint.open_uploads", &json!({ "uploads": uploads }))
            .await?;
        Ok(o.open)
    }

    /// Writes `part` as the part of `upload` at `offset`; the bytes the
    /// node took.
    pub async fn put(&self, upload: String, offset: u64, part: &Encoded) -> Result<u64, LinkError> {
        let link = self.link();
        let cmd = serde_json::to_vec(&PutCommand {
            checkpoint_upload: upload,
            offset,
        })
        .map_err(|e| LinkError::Protocol(e.to_string()))?;
        let sent = part.bytes;
        let mut messages = part.messages.clone();
        if let Some(first) = messages.first_mut() {
            first.flight_descriptor = Some(FlightDescriptor::new_cmd(cmd));
        }
        let messages = futures::stream::iter(messages);
        let reply = link
            .inner
            .clone()
            .do_put(messages)
            .await
            .map_err(|s| link.status(&s))?
            .into_inner()
            .message()
            .await
            .map_err(|s| link.status(&s))?
            .ok_or_else(|| {
                LinkError::Protocol(format!("{} answered a part with nothing", link.node))
            })?;
        #[derive(serde::Deserialize)]
        struct Took {
            bytes: u64,
        }
        let took: Took = serde_json::from_slice(&reply.app_metadata).map_err(|e| {
            LinkError::Protocol(format!("{} sent a bad part reply: {e}", link.node))
        })?;
        if took.bytes != sent {
            return Err(LinkError::Protocol(format!(
                "{} took {} of the {sent} bytes of a part at {offset}",
                link.node, took.bytes
            )));
        }
        Ok(took.bytes)
    }

    /// Commits `upload` as a version of `size` bytes (durable there, and
    /// listed).
    pub async fn commit(&self, upload: &str, size: u64) -> Result<CheckpointInfo, LinkError> {
        self.action(
            "checkpoint.commit",
            &json!({ "upload": upload, "size": size }),
        )
        .await
    }

    /// Abandons `upload`.
    pub async fn abort(&self, upload: &str) -> Result<(), LinkError> {
        self.action::<serde_json::Value>("checkpoint.abort", &json!({ "upload": upload }))
            .await
            .map(drop)
    }

    /// Every version under `prefix`.
    pub async fn list(&self, prefix: &str) -> Result<Vec<CheckpointInfo>, LinkError> {
        self.action("checkpoint.list", &json!({ "prefix": prefix }))
            .await
    }

    /// Deletes every version of `name`; the versions removed.
    pub async fn delete(&self, name: &str) -> Result<Vec<CheckpointInfo>, LinkError> {
        self.action("checkpoint.delete", &json!({ "name": name }))
            .await
    }

    /// Reads back every version under `req.prefix` there against its
    /// checksums (no deadline: it reads every byte, at the rate asked).
    pub async fn scrub(&self, req: &ScrubCheckpoints) -> Result<CheckpointScrub, LinkError> {
        self.action("checkpoint.scrub", req).await
    }

    /// Writes `bytes`, the extent's own, over the extent of `name`
    /// `version` at `offset` there; whether it was rewritten.
    pub async fn repair(
        &self,
        name: &str,
        version: u64,
        offset: u64,
        bytes: &[u8],
    ) -> Result<bool, LinkError> {
        use base64::Engine;
        let req = RepairExtent {
            name: name.to_string(),
            version,
            offset,
            data: base64::engine::general_purpose::STANDARD.encode(bytes),
        };
        let done: RepairedExtent = self.action("checkpoint.repair", &req).await?;
        Ok(done.rewritten)
    }

    /// The bytes `[offset, offset + length)` of version `version` of
    /// `name`, checked there against their crc32c, as buffers in order.
    pub async fn get(
        &self,
        name: &str,
        version: u64,
        offset: u64,
        length: u64,
    ) -> Result<BoxStream<'static, Result<Buffer, LinkError>>, LinkError> {
        let link = self.link().clone();
        let ticket = Ticket::Checkpoint(GetTicket {
            checkpoint: name.to_string(),
            version,
            offset,
            length,
        });
        let messages = link
            .inner
            .clone()
            .do_get(arrow_flight::Ticket {
                ticket: ticket.to_bytes().into(),
            })
            .await
            .map_err(|s| link.status(&s))?
            .into_inner();
        let node = link.node.clone();
        Ok(data::pieces(messages)
            .map_err(move |e| match e {
                PieceError::Status(s) => LinkError::from_status(&node, &s),
                PieceError::Bad(reason) => {
                    LinkError::Protocol(format!("{node} sent checkpoint bytes badly: {reason}"))
                }
            })
            .boxed())
    }
}
