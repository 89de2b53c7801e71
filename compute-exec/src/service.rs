//! [`QueryService`]: a compute node's Arrow Flight service, for SQL
//! clients and trainers on one port.
//!
//! - `DoGet(QueryTicket)` (SQL, offload mode, UDF options) streams the
//!   result, ending with a message whose app metadata is a
//!   [`FragmentReport`] of the bad samples met;
//! - `DoGet(JobTicket)`, `GetFlightInfo(job id)` and `GetSchema(job id)`
//!   are a job's streams to trainers ([`crate::trainer`]);
//! - the `explain` action answers a query's placement as JSON;
//! - `ListFlights` lists the datasets the node can reach, and
//!   `GetFlightInfo`/`GetSchema` of such a descriptor (`[name]` or
//!   `[name, version]`) lead to a `DoGet` of its rows ([`crate::descriptors`]);
//! - with a checkpoint store (`serve` over its own data dir), `DoPut`,
//!   `DoGet` and the `checkpoint.*` actions are the checkpoint protocol of
//!   [`sluice_flight::checkpoint`].

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult,
};
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{Stream, StreamExt, stream};
use serde::{Deserialize, Serialize};
use sluice_flight::BearerAuth;
use sluice_flight::checkpoint::{ACTION_PREFIX, ACTIONS, GetTicket, PutCommand};
use sluice_flight::error::status_of;
use sluice_flight::messages::FragmentReport;
use sluice_flight::stream::send_reported;
use sluice_flight::{CheckpointEndpoint, LinkError, MAX_MESSAGE};
use sluice_planner::Offload;
use sluice_udfs::env::Cancel;
use sluice_udfs::{UdfEnv, UdfOptions};
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use crate::descriptors;
use crate::direct::DirectJobStreams;
use crate::job::Jobs;
use crate::offthread::{plan_on, run_query};
use crate::session::ComputeSession;
use crate::trainer;

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The action answering a query's placement.
pub const EXPLAIN: &str = "explain";

/// A query as a ticket (JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueryTicket {
    /// The SQL.
    pub sql: String,
    /// Where its stages may run.
    #[serde(default)]
    pub offload: Offload,
    /// Its UDF options.
    #[serde(default)]
    pub udf: UdfOptions,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct QueryService {
    session: Arc<ComputeSession>,
    jobs: Arc<Jobs>,
    checkpoints: Option<Arc<dyn CheckpointEndpoint>>,
    query_timeout: Option<Duration>,
}

/// The status for an error of a query: a storage node's error keeps its
/// kind and names the node.
pub fn query_status(e: &DataFusionError, planning: bool) -> Status {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(link) = s.downcast_ref::<LinkError>() {
            return match link {
                LinkError::DatasetNotFound { .. } => Status::not_found(link.to_string()),
                LinkError::Unavailable { .. } => Status::unavailable(link.to_string()),
                _ => Status::internal(link.to_string()),
            };
        }
        source = s.source();
    }
    status_of(e, planning)
}

impl QueryService {
    /// The service of `jobs` and, for queries, of their session.
    pub fn new(jobs: Arc<Jobs>) -> Self {
        Self {
            session: Arc::clone(jobs.session()),
            jobs,
            checkpoints: None,
            query_timeout: None,
        }
    }

    /// A query ticket from a client, its limits capped by the session's
    /// (the server's own).
    fn parse_ticket(&self, bytes: &[u8]) -> Result<QueryTicket, Status> {
        let mut t: QueryTicket = serde_json::from_slice(bytes)
            .map_err(|e| Status::invalid_argument(format!("bad query ticket: {e}")))?;
        t.udf.limits = t.udf.limits.capped_by(self.session.limits());
        Ok(t)
    }

    /// Stops a SQL query that runs past `limit` with an error (job
    /// streams are not queries and have no limit).
    pub fn with_query_timeout(mut self, limit: Option<Duration>) -> Self {
        self.query_timeout = limit;
        self
    }

    /// Serves checkpoints from `store` too.
    pub fn with_checkpoints(mut self, store: Arc<dyn CheckpointEndpoint>) -> Self {
        self.checkpoints = Some(store);
        self
    }

    fn checkpoints(&self) -> Result<&Arc<dyn CheckpointEndpoint>, Status> {
        self.checkpoints.as_ref().ok_or_else(|| {
            Status::unimplemented(
                "this server keeps no checkpoints: they live in the data dir of a `sluice serve` \
                 without --storage",
            )
        })
    }

    /// The tonic server of this service.
    pub fn server(self) -> FlightServiceServer<Self> {
        FlightServiceServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// The service as nodes serve it: behind `auth`, with trainers' job
    /// streams answered by [`DirectJobStreams`] in front of tonic.
    pub fn serve(
        self,
        auth: BearerAuth,
    ) -> DirectJobStreams<InterceptedService<FlightServiceServer<Self>, BearerAuth>> {
        let jobs = Arc::clone(&self.jobs);
        DirectJobStreams::new(
            InterceptedService::new(self.server(), auth.clone()),
            jobs,
            auth,
        )
    }
}

/// `batches`, ending with an error once `limit` has passed since now;
/// `cancel` then stops the UDF batch being evaluated at its next row, and
/// dropping the stream stops the query's tasks.
fn with_deadline(
    batches: SendableRecordBatchStream,
    limit: Duration,
    cancel: Cancel,
) -> SendableRecordBatchStream {
    let schema = batches.schema();
    let deadline = tokio::time::Instant::now() + limit;
    let limited = stream::unfold(Some(batches), move |state| {
        let cancel = cancel.clone();
        async move {
            let mut batches = state?;
            match tokio::time::timeout_at(deadline, batches.next()).await {
                Ok(Some(item)) => Some((item, Some(batches))),
                Ok(None) => None,
                Err(_) => {
                    cancel.cancel();
                    let e = DataFusionError::ResourcesExhausted(format!(
                        "the query ran past its time limit of {:.0} s (--query-timeout) \
                         and was stopped",
                        limit.as_secs_f64()
                    ));
                    Some((Err(e), None))
                }
            }
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, limited))
}

#[tonic::async_trait]
impl FlightService for QueryService {
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
        Err(Status::unimplemented(
            "no handshake: send the bearer token in the authorization header",
        ))
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        self.session.refresh().await.map_err(Status::from)?;
        let mut infos = Vec::new();
        for (name, schema, stats) in self.session.datasets().await {
            let info = FlightInfo::new()
                .try_with_schema(&schema)
                .map_err(|e| Status::internal(e.to_string()))?
                .with_descriptor(FlightDescriptor::new_path(vec![name]))
                .with_total_records(stats.samples as i64)
                .with_total_bytes(stats.bytes as i64);
            infos.push(Ok(info));
        }
        Ok(Response::new(Box::pin(stream::iter(infos))))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let d = request.into_inner();
        if let Some(info) = descriptors::flight_info(&self.session, &d).await? {
            return Ok(Response::new(info));
        }
        let info = trainer::flight_info(&self.jobs, d.clone())
            .await
            .map_err(|s| descriptors::not_found(&d, s))?;
        Ok(Response::new(info))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented(
            "send a query ticket to DoGet, or a job id to GetFlightInfo",
        ))
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        let d = request.get_ref();
        if let Some(schema) = descriptors::schema(&self.session, d).await? {
            return Ok(Response::new(schema));
        }
        Ok(Response::new(
            trainer::schema(&self.jobs, d).map_err(|s| descriptors::not_found(d, s))?,
        ))
    }

    async fn do_get(
        &self,
        request: Request<arrow_flight::Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let ticket = request.into_inner().ticket;
        if trainer::is_job_ticket(&ticket) {
            return Ok(Response::new(trainer::stream(&self.jobs, &ticket).await?));
        }
        if let Some(t) = GetTicket::parse(&ticket) {
            return Ok(Response::new(self.checkpoints()?.get(t).await?));
        }
        let t = self.parse_ticket(&ticket)?;
        let udfs = UdfEnv::new(t.udf);
        // Planned and run on the query runtime: this one stays free for
        // REST, Flight control calls and the deadline below.
        let (session, env) = (Arc::clone(&self.session), Arc::clone(&udfs));
        let mut batches = run_query(self.jobs.handle(), async move {
            session.execute(&t.sql, t.offload, &env).await
        })
        .await
        .map_err(|e| query_status(&e, true))?;
        if let Some(limit) = self.query_timeout {
            batches = with_deadline(batches, limit, udfs.cancel.clone());
        }
        // Dropping the stream (the client left) stops the UDFs at their next row.
        let stop = udfs.cancel.on_drop();
        let stream = send_reported(
            batches.schema(),
            batches,
            |e| query_status(e, false),
            None,
            move |rows, bytes| {
                let _ = &stop;
                let (bad_total, bad) = udfs.errors.snapshot();
                FragmentReport {
                    bad,
                    bad_total,
                    rows,
                    bytes,
                }
            },
        );
        Ok(Response::new(stream))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let checkpoints = Arc::clone(self.checkpoints()?);
        let mut data = request.into_inner();
        let first = data
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("an empty DoPut stream"))?;
        let command = first
            .flight_descriptor
            .as_ref()
            .and_then(|d| PutCommand::parse(&d.cmd))
            .ok_or_else(|| {
                Status::invalid_argument(
                    "DoPut takes checkpoint parts: a descriptor command \
                     {\"checkpoint_upload\", \"offset\"}",
                )
            })?;
        let rest = stream::once(async { Ok(first) }).chain(data).boxed();
        let bytes = checkpoints.put(command, rest).await?;
        let reply = PutResult {
            app_metadata: serde_json::to_vec(&serde_json::json!({ "bytes": bytes }))
                .map_err(|e| Status::internal(e.to_string()))?
                .into(),
        };
        Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))))
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("DoExchange is not used"))
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
        if action.r#type != EXPLAIN {
            return Err(Status::invalid_argument(format!(
                "unknown action {:?} (known: {EXPLAIN})",
                action.r#type
            )));
        }
        let t = self.parse_ticket(&action.body)?;
        let udfs = UdfEnv::new(t.udf);
        let session = Arc::clone(&self.session);
        let body = plan_on(self.jobs.handle(), async move {
            let sql = crate::explain::explained(&t.sql).unwrap_or(&t.sql);
            let q = session.explain(sql, t.offload, &udfs).await?;
            Ok::<_, DataFusionError>(q.explanation.to_json())
        })
        .await
        .map_err(Status::internal)?
        .map_err(|e| query_status(&e, true))?;
        let reply = arrow_flight::Result {
            body: body.into_bytes().into(),
        };
        Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let mut types = vec![ActionType {
            r#type: EXPLAIN.into(),
            description: "the placement of a query ticket, as JSON".into(),
        }];
        if self.checkpoints.is_some() {
            types.extend(ACTIONS.iter().map(|(t, d)| ActionType {
                r#type: (*t).into(),
                description: (*d).into(),
            }));
        }
        Ok(Response::new(Box::pin(stream::iter(
            types.into_iter().map(Ok),
        ))))
    }
}
