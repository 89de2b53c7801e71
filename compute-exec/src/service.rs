//! [`QueryService`]: a compute node's Arrow Flight service, for SQL
//! clients and trainers on one port.
//!
//! - `DoGet` takes one [`Ticket`], told by its tag: a `query` (SQL,
//!   offload mode, UDF options) streams the result, ending with a message
//!   whose app metadata is a [`FragmentReport`] of the bad samples met; a
//!   `job` ticket, `GetFlightInfo(job id)` and `GetSchema(job id)` are a
//!   job's streams to trainers ([`crate::trainer`]); a `checkpoint`
//!   ticket reads a checkpoint range;
//! - the `explain` action answers a query's placement as JSON (its body a
//!   [`QueryTicket`]);
//! - `ListFlights` lists the datasets the node can reach (and the jobs
//!   that can be read, by id), and
//!   `GetFlightInfo`/`GetSchema` of such a descriptor (`[name]` or
//!   `[name, version]`) lead to a `DoGet` of its rows ([`crate::descriptors`]);
//! - Flight SQL (commands, tickets and actions that are Flight SQL
//!   messages) goes to [`crate::flight_sql`];
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
use futures::{Stream, StreamExt, stream};
use sluice_access::auth::principal_of;
use sluice_access::{Auth, Grant};
use sluice_base::fault::status_of;
use sluice_flight::checkpoint::{ACTION_PREFIX, ACTIONS, PutCommand};
use sluice_flight::ticket::{QueryTicket, Ticket};
use sluice_flight::{CheckpointEndpoint, MAX_MESSAGE};
use sluice_udfs::UdfEnv;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};

use crate::descriptors;
use crate::direct::DirectJobStreams;
use crate::flight_sql;
use crate::job::{JobState, Jobs};
use crate::offthread::plan_on;
use crate::queries::Queries;
use crate::trainer;
use sluice_base::CallError;

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The action answering a query's placement.
pub const EXPLAIN: &str = "explain";

/// See the module docs.
#[derive(Debug, Clone)]
pub struct QueryService {
    /// SQL queries: who may run them, and how they run.
    queries: Queries,
    jobs: Arc<Jobs>,
    checkpoints: Option<Arc<dyn CheckpointEndpoint>>,
}

impl QueryService {
    /// The service of `jobs` and, for queries, of their session.
    pub fn new(jobs: Arc<Jobs>) -> Self {
        Self {
            queries: Queries::new(Arc::clone(jobs.session()), jobs.handle().clone()),
            jobs,
            checkpoints: None,
        }
    }

    /// Lets `who` read the job of `id` (one it may not read answers as
    /// refused, one that does not exist as not found). On a compute node
    /// the job is found (adopted from the coordinator) first.
    async fn allow_job(&self, who: &Grant, id: &str) -> Result<(), Status> {
        match self.jobs.find(id).await {
            Ok(job) => self
                .queries
                .allow(who, "read a job", job.may_be_read_by(who)),
            Err(_) => Ok(()),
        }
    }

    /// Stops a SQL query that runs past `limit` with an error (job
    /// streams are not queries and have no limit).
    pub fn with_query_timeout(mut self, limit: Option<Duration>) -> Self {
        self.queries.query_timeout = limit;
        self
    }

    /// Serves checkpoints from `store` too.
    pub fn with_checkpoints(mut self, store: Arc<dyn CheckpointEndpoint>) -> Self {
        self.checkpoints = Some(store);
        self
    }

    /// Its Flight SQL side.
    fn sql(&self) -> flight_sql::SqlService {
        flight_sql::SqlService::new(self.queries.clone())
    }

    /// Lets `who` ask about descriptor `d`: a dataset by its path, or a
    /// job by its id.
    fn allow_descriptor(&self, who: &Grant, d: &FlightDescriptor) -> Result<(), Status> {
        if let Some(dataset) = d.path.first() {
            let allowed = crate::access::may_read(who, dataset);
            return self.queries.allow(who, "describe a dataset", allowed);
        }
        match std::str::from_utf8(&d.cmd) {
            // Held here only: GetFlightInfo answers jobs this node holds.
            Ok(id) => match self.jobs.get(id) {
                Ok(job) => self
                    .queries
                    .allow(who, "describe a job", job.may_be_read_by(who)),
                Err(_) => Ok(()),
            },
            Err(_) => Ok(()),
        }
    }

    fn checkpoints(&self) -> Result<&Arc<dyn CheckpointEndpoint>, Status> {
        self.checkpoints.as_ref().ok_or_else(|| {
            CallError::NotServed(
                "this server keeps no checkpoints: they live in the data dir of a `sluice serve` \
                 without --storage"
                    .into(),
            )
            .status()
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
        mut self,
        auth: Auth,
    ) -> DirectJobStreams<InterceptedService<FlightServiceServer<Self>, Auth>> {
        self.queries.auth = auth.clone();
        let jobs = Arc::clone(&self.jobs);
        DirectJobStreams::new(
            InterceptedService::new(self.server(), auth.clone()),
            jobs,
            auth,
        )
    }
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

    /// Flight's login (what Flight SQL clients given a username and a
    /// password do): the call passed the token check, with the bearer
    /// token or with a `Basic` login whose password is a token; the answer
    /// carries `authorization: Bearer TOKEN` for the calls that follow.
    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        let headers: Vec<String> = request
            .metadata()
            .get_all("authorization")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_owned))
            .collect();
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: Default::default(),
        };
        let mut response: Response<Self::HandshakeStream> =
            Response::new(Box::pin(stream::iter([Ok(reply)])));
        let bearer = headers
            .iter()
            .find_map(|h| sluice_access::auth::basic_password(h).map(|t| format!("Bearer {t}")))
            .or_else(|| {
                headers
                    .iter()
                    .find(|h| h.trim().to_ascii_lowercase().starts_with("bearer "))
                    .map(|h| h.trim().to_string())
            });
        if let Some(value) = bearer.and_then(|b| b.parse().ok()) {
            response.metadata_mut().insert("authorization", value);
        }
        Ok(response)
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let near = request.remote_addr().map(|a| a.ip());
        let who = principal_of(&request);
        self.queries
            .session()
            .refresh()
            .await
            .map_err(|e| sluice_base::fault::status(&e))?;
        let mut infos = Vec::new();
        for (name, schema, stats) in self.queries.session().datasets().await {
            if !who.may_read(&name) {
                continue;
            }
            let info = FlightInfo::new()
                .try_with_schema(&schema)
                .map_err(|e| CallError::encoding(e.to_string()))?
                .with_descriptor(FlightDescriptor::new_path(vec![name]))
                .with_total_records(stats.samples as i64)
                .with_total_bytes(stats.bytes as i64);
            infos.push(Ok(info));
        }
        // Jobs that can be read, by id (what GetFlightInfo takes).
        for job in self.jobs.list() {
            if !matches!(job.state(), JobState::Running | JobState::Done)
                || job.may_be_read_by(&who).is_err()
            {
                continue;
            }
            let d = FlightDescriptor::new_cmd(job.id().to_string());
            if let Ok(info) = trainer::flight_info(&self.jobs, d, near).await {
                infos.push(Ok(info));
            }
        }
        Ok(Response::new(Box::pin(stream::iter(infos))))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        if flight_sql::is_flight_sql(&request.get_ref().cmd) {
            return FlightService::get_flight_info(&self.sql(), request).await;
        }
        // The trainer's host: ranks go to a compute node beside it.
        let near = request.remote_addr().map(|a| a.ip());
        let who = principal_of(&request);
        let d = request.into_inner();
        self.allow_descriptor(&who, &d)?;
        if let Some(info) = descriptors::flight_info(self.queries.session(), &d).await? {
            return Ok(Response::new(info));
        }
        let info = trainer::flight_info(&self.jobs, d.clone(), near)
            .await
            .map_err(|s| descriptors::not_found(&d, s))?;
        Ok(Response::new(info))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(CallError::NotServed(
            "send a query ticket to DoGet, or a job id to GetFlightInfo".into(),
        )
        .status())
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        if flight_sql::is_flight_sql(&request.get_ref().cmd) {
            return self.sql().schema(request).await.map(Response::new);
        }
        let who = principal_of(&request);
        let d = request.get_ref();
        self.allow_descriptor(&who, d)?;
        if let Some(schema) = descriptors::schema(self.queries.session(), d).await? {
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
        if flight_sql::is_flight_sql(&request.get_ref().ticket) {
            return FlightService::do_get(&self.sql(), request).await;
        }
        let who = principal_of(&request);
        Ok(Response::new(
            match Ticket::parse(&request.into_inner().ticket)? {
                Ticket::Job(t) => {
                    self.allow_job(&who, &t.job).await?;
                    trainer::stream(&self.jobs, t).await?
                }
                Ticket::Checkpoint(t) => {
                    let allowed = crate::access::may_checkpoint(&who, &t.checkpoint);
                    self.queries.allow(&who, "read a checkpoint", allowed)?;
                    self.checkpoints()?.get(t).await?
                }
                Ticket::Query(t) => self.queries.run(&who, self.queries.capped(t)).await?,
            },
        ))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let mut data = request.into_inner();
        let first = data
            .message()
            .await?
            .ok_or_else(|| CallError::bad_request("an empty DoPut stream"))?;
        if let Some(d) = first
            .flight_descriptor
            .as_ref()
            .filter(|d| flight_sql::is_flight_sql(&d.cmd))
        {
            // A prepared statement's parameters; every update is refused.
            let cmd = d.cmd.clone();
            let rest = stream::once(async { Ok(first) }).chain(data);
            let reply = self.sql().bind_parameters(&cmd, rest).await?;
            return Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))));
        }
        let checkpoints = Arc::clone(self.checkpoints()?);
        let command = first
            .flight_descriptor
            .as_ref()
            .and_then(|d| PutCommand::parse(&d.cmd))
            .ok_or_else(|| {
                CallError::bad_request(
                    "DoPut takes checkpoint parts: a descriptor command \
                     {\"checkpoint_upload\", \"offset\"}",
                )
            })?;
        let rest = stream::once(async { Ok(first) }).chain(data).boxed();
        let bytes = checkpoints.put(command, rest).await?;
        let reply = PutResult {
            app_metadata: serde_json::to_vec(&serde_json::json!({ "bytes": bytes }))
                .map_err(|e| CallError::encoding(e.to_string()))?
                .into(),
        };
        Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))))
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(CallError::NotServed("DoExchange is not used".into()).status())
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        if flight_sql::ACTIONS.contains(&request.get_ref().r#type.as_str()) {
            return FlightService::do_action(&self.sql(), request).await;
        }
        let who = principal_of(&request);
        let action = request.into_inner();
        if action.r#type.starts_with(ACTION_PREFIX) {
            if let Some(name) = crate::access::checkpoint_of_action(&action.body) {
                let allowed = crate::access::may_checkpoint(&who, &name);
                self.queries.allow(&who, &action.r#type, allowed)?;
            }
            let body = self
                .checkpoints()?
                .action(&action.r#type, &action.body)
                .await?;
            let reply = arrow_flight::Result { body };
            return Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))));
        }
        if action.r#type != EXPLAIN {
            return Err(CallError::bad_request(format!(
                "unknown action {:?} (known: {EXPLAIN})",
                action.r#type
            )));
        }
        let t: QueryTicket = serde_json::from_slice(&action.body).map_err(|e| {
            CallError::bad_request(format!("explain: the body is a query ticket: {e}"))
        })?;
        let t = self.queries.capped(t);
        let sql = crate::explain::explained(&t.sql).unwrap_or(&t.sql);
        self.queries
            .allow(&who, "explain", crate::access::may_query(&who, sql))?;
        let udfs = UdfEnv::new(t.udf);
        let session = Arc::clone(self.queries.session());
        let body = plan_on(self.jobs.handle(), async move {
            let sql = crate::explain::explained(&t.sql).unwrap_or(&t.sql);
            let q = session.explain(sql, t.offload, &udfs).await?;
            Ok::<_, DataFusionError>(q.explanation.to_json())
        })
        .await
        .map_err(Status::internal)?
        .map_err(|e| status_of(&e, true))?;
        let reply = arrow_flight::Result {
            body: body.into_bytes().into(),
        };
        Ok(Response::new(Box::pin(stream::iter([Ok(reply)]))))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let mut types = vec![
            ActionType {
                r#type: EXPLAIN.into(),
                description: "the placement of a query ticket, as JSON".into(),
            },
            ActionType {
                r#type: "CreatePreparedStatement".into(),
                description: "Flight SQL: prepare a read query".into(),
            },
            ActionType {
                r#type: "ClosePreparedStatement".into(),
                description: "Flight SQL: close a prepared statement".into(),
            },
        ];
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
