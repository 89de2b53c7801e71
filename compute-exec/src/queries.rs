//! [`Queries`]: the SQL queries of a compute node's Flight port — who may
//! run one (each refusal to the audit log), a client's UDF limits capped
//! by the server's, and a query planned and run on the query runtime,
//! stopped past `--query-timeout`. The service's `DoGet` of a query
//! ticket and Flight SQL both run their queries here.

use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow_flight::FlightData;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, stream};
use sluice_access::auth::forbidden;
use sluice_access::{Auth, Grant};
use sluice_base::fault::status_of;
use sluice_flight::stream::send_reported;
use sluice_flight::ticket::QueryTicket;
use sluice_planner::fragment::FragmentReport;
use sluice_udfs::UdfEnv;
use sluice_udfs::env::Cancel;
use tokio::runtime::Handle;
use tonic::Status;

use crate::offthread::{plan_on, run_query};
use crate::session::ComputeSession;

type Boxed<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send + 'static>>;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Queries {
    session: Arc<ComputeSession>,
    /// The runtime queries are planned and run on (the jobs' runtime),
    /// so the one answering calls stays free.
    runtime: Handle,
    /// How long a query may run (none: no limit).
    pub(crate) query_timeout: Option<Duration>,
    /// Who may call, and the audit log.
    pub(crate) auth: Auth,
}

impl Queries {
    /// Queries over `session`, run on `runtime`.
    pub fn new(session: Arc<ComputeSession>, runtime: Handle) -> Self {
        Self {
            session,
            runtime,
            query_timeout: None,
            auth: Auth::default(),
        }
    }

    /// Lets `who` do `what` when `allowed` passes; otherwise writes the
    /// refusal to the audit log and answers `PermissionDenied`.
    pub(crate) fn allow(
        &self,
        who: &Grant,
        what: &str,
        allowed: Result<(), String>,
    ) -> Result<(), Status> {
        allowed.map_err(|why| {
            self.auth.audit().refused(who.name(), None, what, &why);
            forbidden(&why)
        })
    }

    /// Runs a query ticket: its result's Flight messages, ending with a
    /// message whose app metadata is the [`FragmentReport`] of what it
    /// met (bad samples, stage times).
    pub(crate) async fn run(
        &self,
        who: &Grant,
        t: QueryTicket,
    ) -> Result<Boxed<FlightData>, Status> {
        self.allow(who, "query", crate::access::may_query(who, &t.sql))?;
        let udfs = UdfEnv::new(t.udf);
        // Planned and run on the query runtime: this one stays free for
        // REST, Flight control calls and the deadline below.
        let (session, env) = (Arc::clone(&self.session), Arc::clone(&udfs));
        let mut batches = run_query(&self.runtime, async move {
            session.execute(&t.sql, t.offload, &env).await
        })
        .await
        .map_err(|e| status_of(&e, true))?;
        if let Some(limit) = self.query_timeout {
            batches = with_deadline(batches, limit, udfs.cancel.clone());
        }
        // Dropping the stream (the client left) stops the UDFs at their next row.
        let stop = udfs.cancel.on_drop();
        Ok(send_reported(
            batches.schema(),
            batches,
            |e| status_of(e, false),
            None,
            move |rows, bytes| {
                let _ = &stop;
                FragmentReport::of(&udfs, rows, bytes)
            },
        ))
    }

    /// The schema a query ticket's result will have (planned, not run).
    pub(crate) async fn schema_of(&self, who: &Grant, t: QueryTicket) -> Result<SchemaRef, Status> {
        self.allow(who, "query", crate::access::may_query(who, &t.sql))?;
        let session = Arc::clone(&self.session);
        plan_on(&self.runtime, async move {
            let udfs = UdfEnv::new(t.udf);
            if crate::explain::explained(&t.sql).is_some() {
                return Ok(crate::explain::explain_schema());
            }
            let q = session.plan(&t.sql, t.offload, &udfs).await?;
            Ok::<_, DataFusionError>(q.plan.schema())
        })
        .await
        .map_err(Status::internal)?
        .map_err(|e| status_of(&e, true))
    }

    /// The session it queries.
    pub(crate) fn session(&self) -> &Arc<ComputeSession> {
        &self.session
    }

    /// Caps a client's UDF limits by the server's.
    pub(crate) fn capped(&self, mut t: QueryTicket) -> QueryTicket {
        t.udf.limits = t.udf.limits.capped_by(self.session.limits());
        t
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
