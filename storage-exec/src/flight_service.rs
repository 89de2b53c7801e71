//! [`StorageFlightService`]: a [`StorageNode`] as an Arrow Flight service.
//!
//! - `ListFlights`: one `FlightInfo` per dataset (its name and latest
//!   version as the descriptor path, schema, counts, and the
//!   planner's statistics as JSON app metadata);
//! - `DoAction("node_info")`: the node's cores and link limit;
//! - `DoAction("time_fragment")`: a fragment run for at most a budget,
//!   its rows dropped: its CPU time and rows (calibration);
//! - `DoAction("prepare_ingest" | "finish_ingest")`: this node's part of
//!   an ingest spread over several nodes, prepared beneath the node's own
//!   ingest roots and then committed or dropped (`sluice_flight::ingest`);
//! - `DoPut`: a replica's rows, copied in by a move (`sluice_flight::copy`);
//! - `DoGet(Ticket)`: a probe of N bytes (the link's measure);
//! - with checkpoints ([`StorageFlightService::with_checkpoints`]), the
//!   checkpoint protocol of `sluice_flight::checkpoint`: `checkpoint.*`
//!   actions, a `DoPut` whose descriptor names an upload, a `DoGet` whose
//!   ticket is a checkpoint's (JSON). A cluster's coordinator keeps the
//!   stripes of its checkpoints on its nodes through it.
//!
//! Storage fragments (a query's, a job stream's windows, a move's or a
//! repair's read) do not run here: they are tasks of the distributed
//! engine's worker, served beside this service ([`crate::engine`]).
//!
//! Errors keep their kind on the wire (see `sluice_flight::error`): a
//! missing dataset is `NOT_FOUND`, a fragment that cannot be decoded or
//! planned `INVALID_ARGUMENT`, a failure while running `INTERNAL` with the
//! UDF's message (which names the sample).

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult,
};
use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt, stream};
use prost::Message;
use sluice_base::CallError;
use sluice_base::fault::{self, status_of};
use sluice_flight::checkpoint::{ACTION_PREFIX, CheckpointEndpoint, PutCommand};
use sluice_flight::copy::{CopyIn, RETIRE, Retire};
use sluice_flight::ingest::{FINISH_INGEST, FinishIngest, IngestPart, PREPARE_INGEST};
use sluice_flight::messages::{
    NODE_INFO, ProbeTicket, TIME_FRAGMENT, Ticket, TicketKind, TimeTicket,
};
use sluice_flight::scrub::{REPAIR_OBJECT, RepairObject, SCRUB, ScrubRequest};
use sluice_flight::{FragmentTiming, MAX_FLIGHT_DATA, MAX_MESSAGE};
use sluice_planner::fragment::decode_fragment;
use sluice_udfs::{Limits, UdfEnv, UdfOptions};
use tonic::{Request, Response, Status, Streaming};

use crate::checkpoint::Checkpoints;
use crate::error::StorageError;
use crate::node::StorageNode;
use sluice_access::{ReadPass, UploadPass};

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct StorageFlightService {
    node: Arc<StorageNode>,
    limits: Limits,
    checkpoints: Option<Arc<Checkpoints>>,
}

impl StorageFlightService {
    /// The service of `node`.
    pub fn new(node: Arc<StorageNode>) -> Self {
        Self {
            node,
            limits: Limits::default(),
            checkpoints: None,
        }
    }

    /// Serves the checkpoint protocol over `checkpoints` too.
    pub fn with_checkpoints(mut self, checkpoints: Arc<Checkpoints>) -> Self {
        self.checkpoints = Some(checkpoints);
        self
    }

    fn checkpoints(&self) -> Result<&Arc<Checkpoints>, Status> {
        self.checkpoints.as_ref().ok_or_else(|| {
            CallError::NotServed("this storage node keeps no checkpoints".into()).status()
        })
    }

    /// This node's decoding limits: a fragment's options may lower them,
    /// never raise them (default: [`Limits::default`]).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The tonic server of this service, with sluice's message limits.
    pub fn server(self) -> FlightServiceServer<Self> {
        FlightServiceServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// Times a fragment for calibration (`time_fragment`).
    async fn time(&self, body: &[u8]) -> Result<FragmentTiming, Status> {
        let t = TimeTicket::decode(body)
            .map_err(|e| CallError::bad_request(format!("bad time_fragment body: {e}")))?;
        let f = t
            .fragment
            .ok_or_else(|| CallError::bad_request("time_fragment without a fragment"))?;
        let mut options: UdfOptions = serde_json::from_str(&f.udf_options)
            .map_err(|e| CallError::bad_request(format!("bad UDF options: {e}")))?;
        options.limits = options.limits.capped_by(&self.limits);
        let udfs = UdfEnv::new(options);
        let ctx = self.node.session(&udfs);
        let plan = decode_fragment(&f.plan, &ctx.task_ctx()).map_err(|e| status_of(&e, true))?;
        let plan = self.node.bind(&ctx, plan).await.map_err(Status::from)?;
        // A budget past a minute is a client's mistake, not a wish.
        let budget = std::time::Duration::from_millis(t.budget_ms.min(60_000));
        self.node
            .time_run(plan, &ctx, &udfs, budget)
            .await
            .map_err(Status::from)
    }

    fn probe(&self, t: ProbeTicket) -> Boxed<FlightData> {
        let chunk = Bytes::from(vec![0u8; MAX_FLIGHT_DATA]);
        let n = t.bytes.div_ceil(MAX_FLIGHT_DATA as u64);
        let link = self.node.link().cloned();
        Box::pin(stream::iter(0..n).then(move |_| {
            let chunk = chunk.clone();
            let link = link.clone();
            async move {
                if let Some(l) = link {
                    l.take(chunk.len()).await;
                }
                Ok(FlightData::new().with_data_body(chunk))
            }
        }))
    }
}

/// An action's JSON body, or INVALID_ARGUMENT naming the action.
fn json_body<T: serde::de::DeserializeOwned>(action: &Action) -> Result<T, Status> {
    serde_json::from_slice(&action.body)
        .map_err(|e| CallError::bad_request(format!("bad {} body: {e}", action.r#type)))
}

#[tonic::async_trait]
impl FlightService for StorageFlightService {
    type HandshakeStream = Boxed<HandshakeResponse>;
    type ListFlightsStream = Boxed<FlightInfo>;
    type DoGetStream = Boxed<FlightData>;
    type DoPutStream = Boxed<PutResult>;
    type DoExchangeStream = Boxed<FlightData>;
    type DoActionStream = Boxed<arrow_flight::Result>;
    type ListActionsStream = Boxed<ActionType>;

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(CallError::NotServed("storage nodes need no handshake".into()).status())
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let node = Arc::clone(&self.node);
        let datasets = tokio::task::spawn_blocking(move || node.list())
            .await
            .map_err(|e| CallError::encoding(e.to_string()))?
            .map_err(Status::from)?;
        let mut infos = Vec::new();
        for d in datasets {
            let stats =
                serde_json::to_vec(&d.stats).map_err(|e| CallError::encoding(e.to_string()))?;
            let info = FlightInfo::new()
                .try_with_schema(&d.schema)
                .map_err(|e| CallError::encoding(e.to_string()))?
                .with_descriptor(FlightDescriptor::new_path(vec![
                    d.name.clone(),
                    d.version.to_string(),
                ]))
                .with_total_records(d.stats.samples as i64)
                .with_total_bytes(d.stats.bytes as i64)
                .with_app_metadata(stats);
            infos.push(Ok(info));
        }
        Ok(Response::new(Box::pin(stream::iter(infos))))
    }

    async fn get_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(CallError::NotServed("use ListFlights to list datasets".into()).status())
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(CallError::NotServed("fragments are not long-running queries".into()).status())
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        let name = request
            .into_inner()
            .path
            .first()
            .cloned()
            .unwrap_or_default();
        let node = Arc::clone(&self.node);
        let schema = tokio::task::spawn_blocking(move || node.table_schema(&name))
            .await
            .map_err(|e| CallError::encoding(e.to_string()))?
            .map_err(Status::from)?;
        let options = arrow::ipc::writer::IpcWriteOptions::default();
        let result: SchemaResult = SchemaAsIpc::new(&schema, &options)
            .try_into()
            .map_err(|e: arrow::error::ArrowError| CallError::encoding(e.to_string()))?;
        Ok(Response::new(result))
    }

    async fn do_get(
        &self,
        request: Request<arrow_flight::Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        // A get that came in with a read pass and no token
        // (`sluice_access::PassGate`) may only read the version its pass
        // was signed for.
        let pass = request.extensions().get::<ReadPass>().cloned();
        let bytes = request.into_inner().ticket;
        let ticket = sluice_flight::Ticket::parse(&bytes);
        if let Some(pass) = pass {
            let admitted = match &ticket {
                Ok(sluice_flight::Ticket::Checkpoint(t)) => {
                    self.checkpoints()?
                        .admits_read(&pass, &t.checkpoint, t.version)
                }
                _ => false,
            };
            if !admitted {
                return Err(sluice_access::auth::forbidden(
                    "a read pass reads the checkpoint version it was given for, nothing else",
                ));
            }
        }
        if let Ok(sluice_flight::Ticket::Checkpoint(t)) = ticket {
            let checkpoints = self.checkpoints()?;
            return Ok(Response::new(
                CheckpointEndpoint::get(&**checkpoints, t).await?,
            ));
        }
        let ticket = Ticket::decode(bytes)
            .map_err(|e| CallError::bad_request(format!("bad ticket: {e}")))?;
        let stream = match ticket.kind {
            Some(TicketKind::Probe(p)) => self.probe(p),
            // A fragment's ticket (of a client from before the engine)
            // decodes to no kind: fragments run on the engine's worker.
            None => {
                return Err(CallError::bad_request(
                    "a ticket asks for a probe; storage fragments run on the engine's worker",
                ));
            }
        };
        Ok(Response::new(stream))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        // A checkpoint's part, or a replica's rows (`sluice_flight::copy`):
        // the first message's descriptor names the upload or the move. A
        // put that came in with an upload pass and no token
        // (`sluice_access::PassGate`) may only be a part of that upload.
        let pass = request.extensions().get::<UploadPass>().cloned();
        let mut data = request.into_inner();
        let first = data
            .message()
            .await?
            .ok_or_else(|| CallError::bad_request("an empty put"))?;
        let command = first
            .flight_descriptor
            .as_ref()
            .and_then(|d| PutCommand::parse(&d.cmd));
        if let Some(pass) = pass {
            let command = command.ok_or_else(|| {
                sluice_access::auth::forbidden(
                    "an upload pass writes a checkpoint upload's parts, nothing else",
                )
            })?;
            let checkpoints = self.checkpoints()?;
            let rest = stream::once(async { Ok(first) }).chain(data).boxed();
            let pieces = sluice_flight::checkpoint::data::pieces(rest).map_err(|e| {
                StorageError::BadUpload {
                    name: "(upload)".into(),
                    reason: format!("part stream: {e}"),
                }
            });
            let bytes = checkpoints
                .write_with_pass(&command.checkpoint_upload, &pass, command.offset, pieces)
                .await
                .map_err(crate::checkpoint::status)?;
            return put_result(bytes);
        }
        if let Some(command) = command {
            let checkpoints = self.checkpoints()?;
            let rest = stream::once(async { Ok(first) }).chain(data).boxed();
            let bytes = checkpoints.put(command, rest).await?;
            return put_result(bytes);
        }
        let req: CopyIn = first
            .flight_descriptor
            .as_ref()
            .and_then(|d| serde_json::from_slice(&d.cmd).ok())
            .ok_or_else(|| {
                CallError::bad_request(
                    "a put must name a copy (its descriptor's command, as JSON); ingest \
                     sources with `sluice ingest`",
                )
            })?;
        let rest = stream::unfold(data, |mut d| async move {
            match d.message().await {
                Ok(Some(m)) => Some((Ok(m), d)),
                Ok(None) => None,
                Err(s) => Some((Err(FlightError::Tonic(Box::new(s))), d)),
            }
        });
        let rows = FlightRecordBatchStream::new_from_flight_data(
            stream::once(async { Ok(first) }).chain(rest),
        );
        let prepared = self
            .node
            .prepare_copy(&req, rows)
            .await
            .map_err(|e| fault::status(&e))?;
        let body = serde_json::to_vec(&prepared).map_err(|e| CallError::encoding(e.to_string()))?;
        let reply = PutResult {
            app_metadata: body.into(),
        };
        Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))))
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(CallError::NotServed(
            "a storage node takes no exchange: a job stream's windows run on the engine's worker"
                .into(),
        )
        .status())
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let action = request.into_inner();
        if action.r#type.starts_with(ACTION_PREFIX) {
            let body = self
                .checkpoints()?
                .action(&action.r#type, &action.body)
                .await?;
            let reply = arrow_flight::Result { body };
            return Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))));
        }
        let body = match action.r#type.as_str() {
            NODE_INFO => serde_json::to_vec(&self.node.info()),
            TIME_FRAGMENT => serde_json::to_vec(&self.time(&action.body).await?),
            PREPARE_INGEST => {
                let part: IngestPart = json_body(&action)?;
                let prepared = self
                    .node
                    .prepare_part(&part)
                    .await
                    .map_err(|e| fault::status(&e))?;
                serde_json::to_vec(&prepared)
            }
            SCRUB => {
                let req: ScrubRequest = json_body(&action)?;
                let report = crate::scrub::scrub(self.node.store(), &req)
                    .await
                    .map_err(|e| fault::status(&e))?;
                serde_json::to_vec(&report)
            }
            REPAIR_OBJECT => {
                let req: RepairObject = json_body(&action)?;
                let done = self
                    .node
                    .repair(&req)
                    .await
                    .map_err(|e| fault::status(&e))?;
                serde_json::to_vec(&done)
            }
            RETIRE => {
                let req: Retire = json_body(&action)?;
                let done = self.node.retire(&req).map_err(|e| fault::status(&e))?;
                serde_json::to_vec(&done)
            }
            FINISH_INGEST => {
                let word: FinishIngest = json_body(&action)?;
                let done = self
                    .node
                    .finish_part(&word.txn, word.commit)
                    .await
                    .map_err(|e| fault::status(&e))?;
                match done {
                    Some(part) => serde_json::to_vec(&part),
                    None => return Ok(Response::new(Box::pin(stream::empty()))),
                }
            }
            other => {
                return Err(CallError::bad_request(format!(
                    "unknown action {other:?} (known: {NODE_INFO}, {TIME_FRAGMENT}, \
                     {PREPARE_INGEST}, {FINISH_INGEST}, {SCRUB}, {REPAIR_OBJECT}, {RETIRE})"
                )));
            }
        }
        .map_err(|e| CallError::encoding(e.to_string()))?;
        let reply = arrow_flight::Result { body: body.into() };
        Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let info = ActionType {
            r#type: NODE_INFO.into(),
            description: "the node's cores and link limit, as JSON".into(),
        };
        let time = ActionType {
            r#type: TIME_FRAGMENT.into(),
            description: "run a fragment without sending its rows; its CPU time and rows, as JSON"
                .into(),
        };
        let prepare = ActionType {
            r#type: PREPARE_INGEST.into(),
            description: "prepare this node's part of an ingest, uncommitted (JSON)".into(),
        };
        let finish = ActionType {
            r#type: FINISH_INGEST.into(),
            description: "commit or drop a prepared ingest part (JSON)".into(),
        };
        Ok(Response::new(Box::pin(stream::iter([
            Ok(info),
            Ok(time),
            Ok(prepare),
            Ok(finish),
        ]))))
    }
}

/// The answer to a checkpoint part: the bytes taken.
fn put_result(bytes: u64) -> Result<Response<Boxed<PutResult>>, Status> {
    let body = serde_json::to_vec(&serde_json::json!({ "bytes": bytes }))
        .map_err(|e| CallError::encoding(e.to_string()))?;
    let reply = PutResult {
        app_metadata: body.into(),
    };
    Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))))
}
