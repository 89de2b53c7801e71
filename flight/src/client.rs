//! [`StorageClient`]: a storage node over Arrow Flight.

use std::sync::Arc;
use std::time::Instant;

use arrow::datatypes::SchemaRef;
use arrow_flight::{Action, Criteria, FlightDescriptor};
use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use sluice_udfs::UdfEnv;

use crate::copy::{CopyIn, RETIRE, Retire, Retired};
use crate::credential::Credential;
use crate::endpoint::{FragmentTiming, NodeInfo, RemoteDataset, StorageEndpoint};
use crate::error::LinkError;
use crate::ingest::{
    FINISH_INGEST, FinishIngest, IngestPart, IngestedPart, PREPARE_INGEST, PreparedPart,
};
use crate::link::Link;
use crate::messages::{
    FragmentTicket, NODE_INFO, ProbeTicket, TIME_FRAGMENT, Ticket, TicketKind, TimeTicket,
};
use crate::scrub::{REPAIR_OBJECT, RepairObject, Repaired, SCRUB, ScrubReport, ScrubRequest};
use sluice_planner::fragment::encode_fragment;

/// A typed Flight client of one storage node. Connections are made on
/// first use, so a node that is down fails the requests that need it (with
/// an error naming it), not the client's creation.
#[derive(Debug, Clone)]
pub struct StorageClient {
    link: Link,
    credential: Credential,
}

impl StorageClient {
    /// A client of the node at `url` (`http://host:port`) that presents no
    /// credential.
    pub fn new(url: &str) -> Result<Self, LinkError> {
        Self::with_credential(url, Credential::default())
    }

    /// A client of the node at `url` presenting `credential` (this node's
    /// token) on every call.
    pub fn with_credential(url: &str, credential: Credential) -> Result<Self, LinkError> {
        Ok(Self {
            link: Link::connect(url, credential.clone())?,
            credential,
        })
    }

    /// Runs action `kind` with `body`; its one reply, as JSON (`None`:
    /// the node sent none).
    async fn action<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        body: Vec<u8>,
    ) -> Result<Option<T>, LinkError> {
        let action = Action {
            r#type: kind.into(),
            body: body.into(),
        };
        let mut replies = self
            .link
            .inner
            .clone()
            .do_action(action)
            .await
            .map_err(|s| self.link.status(&s))?
            .into_inner();
        let Some(reply) = replies.message().await.map_err(|s| self.link.status(&s))? else {
            return Ok(None);
        };
        serde_json::from_slice(&reply.body).map(Some).map_err(|e| {
            LinkError::Protocol(format!("{} sent a bad {kind} reply: {e}", self.link.node))
        })
    }

    /// [`StorageClient::action`] with a JSON `body`.
    async fn json_action<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        body: &impl serde::Serialize,
    ) -> Result<Option<T>, LinkError> {
        let body = serde_json::to_vec(body).map_err(|e| LinkError::Protocol(e.to_string()))?;
        self.action(kind, body).await
    }

    async fn get(
        &self,
        ticket: Ticket,
    ) -> Result<tonic::Streaming<arrow_flight::FlightData>, LinkError> {
        let ticket = arrow_flight::Ticket {
            ticket: ticket.encode_to_vec().into(),
        };
        Ok(self
            .link
            .inner
            .clone()
            .do_get(ticket)
            .await
            .map_err(|s| self.link.status(&s))?
            .into_inner())
    }
}

/// The ticket of `fragment`, run with `udfs`' options.
fn fragment_ticket(
    fragment: Arc<dyn ExecutionPlan>,
    udfs: &UdfEnv,
) -> Result<FragmentTicket, LinkError> {
    let plan = encode_fragment(fragment)
        .map_err(|e| LinkError::Protocol(format!("cannot encode the fragment: {e}")))?;
    let udf_options =
        serde_json::to_string(&udfs.options).map_err(|e| LinkError::Protocol(e.to_string()))?;
    Ok(FragmentTicket { plan, udf_options })
}

#[async_trait]
impl StorageEndpoint for StorageClient {
    fn credential(&self) -> Option<&Credential> {
        Some(&self.credential)
    }

    fn channel(&self) -> Option<tonic::transport::Channel> {
        Some(self.link.channel.clone())
    }

    fn name(&self) -> &str {
        &self.link.node
    }

    async fn node_info(&self) -> Result<NodeInfo, LinkError> {
        self.json_action(NODE_INFO, &())
            .await?
            .ok_or_else(|| LinkError::Protocol(format!("{} sent no node info", self.link.node)))
    }

    async fn datasets(&self) -> Result<Vec<RemoteDataset>, LinkError> {
        let mut infos = self
            .link
            .inner
            .clone()
            .list_flights(Criteria::default())
            .await
            .map_err(|s| self.link.status(&s))?
            .into_inner();
        let mut out = Vec::new();
        while let Some(info) = infos.message().await.map_err(|s| self.link.status(&s))? {
            let bad = |what: &str| {
                LinkError::Protocol(format!("{} listed a dataset with {what}", self.link.node))
            };
            let path = info
                .flight_descriptor
                .as_ref()
                .map(|d| d.path.clone())
                .unwrap_or_default();
            let [name, version] = path.as_slice() else {
                return Err(bad("no name and version"));
            };
            let version = version.parse().map_err(|_| bad("a bad version"))?;
            let schema = info
                .clone()
                .try_decode_schema()
                .map_err(|e| bad(&format!("a bad schema ({e})")))?;
            let stats = serde_json::from_slice(&info.app_metadata)
                .map_err(|e| bad(&format!("bad statistics ({e})")))?;
            out.push(RemoteDataset {
                name: name.clone(),
                version,
                schema: Arc::new(schema),
                stats,
            });
        }
        Ok(out)
    }

    async fn time(
        &self,
        fragment: Arc<dyn ExecutionPlan>,
        udfs: Arc<UdfEnv>,
        budget: std::time::Duration,
    ) -> Result<FragmentTiming, LinkError> {
        let body = TimeTicket {
            fragment: Some(fragment_ticket(fragment, &udfs)?),
            budget_ms: budget.as_millis() as u64,
        };
        // The node stops at its budget; a node that does not answer well
        // after it (dead, or wedged) is named, never waited on for ever.
        let wait = budget + std::time::Duration::from_secs(30);
        tokio::time::timeout(wait, self.action(TIME_FRAGMENT, body.encode_to_vec()))
            .await
            .map_err(|_| LinkError::Unavailable {
                node: self.link.node.clone(),
                reason: format!("timing a fragment took over {} s", wait.as_secs()),
            })??
            .ok_or_else(|| LinkError::Protocol(format!("{} sent no timing", self.link.node)))
    }

    async fn table_schema(&self, table: &str) -> Result<SchemaRef, LinkError> {
        let reply = self
            .link
            .inner
            .clone()
            .get_schema(FlightDescriptor::new_path(vec![table.to_string()]))
            .await
            .map_err(|s| self.link.status(&s))?
            .into_inner();
        let schema = arrow::datatypes::Schema::try_from(&reply).map_err(|e| {
            LinkError::Protocol(format!(
                "{} sent a bad schema for {table}: {e}",
                self.link.node
            ))
        })?;
        Ok(Arc::new(schema))
    }

    async fn probe(&self, bytes: u64) -> Result<Option<f64>, LinkError> {
        let start = Instant::now();
        let mut raw = self
            .get(Ticket {
                kind: Some(TicketKind::Probe(ProbeTicket { bytes })),
            })
            .await?;
        let mut got = 0u64;
        while let Some(d) = raw.next().await {
            let d = d.map_err(|s| self.link.status(&s))?;
            got += (d.data_body.len() + d.data_header.len()) as u64;
        }
        let secs = start.elapsed().as_secs_f64().max(1e-6);
        Ok(Some(got as f64 / secs))
    }

    async fn prepare_ingest(&self, part: &IngestPart) -> Result<PreparedPart, LinkError> {
        // No deadline: a part takes as long as its objects take to write;
        // a node that dies while preparing breaks the connection.
        self.json_action(PREPARE_INGEST, part)
            .await?
            .ok_or_else(|| LinkError::Protocol(format!("{} prepared nothing", self.link.node)))
    }

    async fn scrub(&self, req: &ScrubRequest) -> Result<ScrubReport, LinkError> {
        // No deadline: a scrub reads every object, at the rate asked.
        self.json_action(SCRUB, req)
            .await?
            .ok_or_else(|| LinkError::Protocol(format!("{} scrubbed nothing", self.link.node)))
    }

    async fn repair_object(&self, req: &RepairObject) -> Result<Repaired, LinkError> {
        self.json_action(REPAIR_OBJECT, req)
            .await?
            .ok_or_else(|| LinkError::Protocol(format!("{} repaired nothing", self.link.node)))
    }

    async fn copy_in(
        &self,
        req: &CopyIn,
        rows: SendableRecordBatchStream,
    ) -> Result<PreparedPart, LinkError> {
        let cmd = serde_json::to_vec(req).map_err(|e| LinkError::Protocol(e.to_string()))?;
        // The rows' source failing ends the put early; the node then
        // prepares what it got, which is dropped here, never committed.
        let failed: Arc<std::sync::Mutex<Option<DataFusionError>>> = Arc::default();
        let seen = Arc::clone(&failed);
        // The schema goes first whatever follows: it carries the
        // descriptor, and a node that only drops rows is sent none.
        let schema = rows.schema();
        let rows = rows.map_err(|e| arrow_flight::error::FlightError::ExternalError(Box::new(e)));
        let data = arrow_flight::encode::FlightDataEncoderBuilder::new()
            .with_max_flight_data_size(crate::MAX_FLIGHT_DATA)
            .with_flight_descriptor(Some(FlightDescriptor::new_cmd(cmd)))
            .with_schema(schema)
            .build(rows)
            .scan((), move |(), d| {
                futures::future::ready(match d {
                    Ok(d) => Some(d),
                    Err(e) => {
                        *seen.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(DataFusionError::External(Box::new(e)));
                        None
                    }
                })
            });
        let put = self.link.inner.clone().do_put(data).await;
        let reply = match put {
            Ok(replies) => replies.into_inner().message().await,
            Err(s) => Err(s),
        };
        // The source's error first: the node's, if any, follows from it.
        let source_error = failed.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(e) = source_error {
            let _ = self.finish_ingest(&req.txn, false).await;
            return Err(LinkError::Protocol(format!(
                "the rows copied to {} failed on their way: {e}",
                self.link.node
            )));
        }
        let reply = reply.map_err(|s| self.link.status(&s))?.ok_or_else(|| {
            LinkError::Protocol(format!("{} answered a copy with nothing", self.link.node))
        })?;
        serde_json::from_slice(&reply.app_metadata).map_err(|e| {
            LinkError::Protocol(format!("{} sent a bad copy reply: {e}", self.link.node))
        })
    }

    async fn retire(&self, req: &Retire) -> Result<Retired, LinkError> {
        self.json_action(RETIRE, req)
            .await?
            .ok_or_else(|| LinkError::Protocol(format!("{} retired nothing", self.link.node)))
    }

    async fn finish_ingest(
        &self,
        txn: &str,
        commit: bool,
    ) -> Result<Option<IngestedPart>, LinkError> {
        let word = FinishIngest {
            txn: txn.to_string(),
            commit,
        };
        let ask = self.json_action(FINISH_INGEST, &word);
        tokio::time::timeout(std::time::Duration::from_secs(60), ask)
            .await
            .map_err(|_| LinkError::Unavailable {
                node: self.link.node.clone(),
                reason: "no answer to finish an ingest within 60 s".into(),
            })?
    }
}
