//! Flight SQL on the compute node's Flight port: what ADBC's Flight SQL
//! driver, JDBC/ODBC tools and `pyarrow` clients send.
//!
//! ```text
//!  QueryService (one port) ─ a ticket, descriptor or action that is a Flight SQL
//!     message (protobuf Any of arrow.flight.protocol.sql.*) ─► SqlService
//!  CommandStatementQuery ─► planned (read-only, the server's limits and placement)
//!     ─► FlightInfo {schema, one endpoint: TicketStatementQuery{handle}} ─► DoGet
//!  CreatePreparedStatement ─► {handle, dataset schema} ─► CommandPreparedStatementQuery
//!     ─► FlightInfo ─► DoGet;  ClosePreparedStatement: nothing to free
//!  GetCatalogs / GetDbSchemas / GetTables (datasets, and each node's latest version
//!     as `name@V`, with their Arrow schemas) / GetTableTypes / GetSqlInfo
//! ```
//!
//! A statement handle is the query ticket itself (JSON: the SQL, the
//! offload mode, the UDF options): nothing is kept per statement on the
//! server, so a closed, forgotten or replayed handle costs nothing, and a
//! prepared statement runs exactly what was prepared. The rows are those of
//! the query ticket's `DoGet` (`sluice sql --connect`), without its
//! closing report message, which Flight SQL clients do not expect.
//!
//! Options a pipeline query needs travel as request headers (`headers`).
//! The token is the bearer `authorization` header every Flight call of
//! this port needs. The catalog commands are one handler (`catalog_commands`);
//! writes are refused by their first word (`read_only`).

use std::pin::Pin;

use arrow::datatypes::Schema;
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::sql::server::FlightSqlService;
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, Command, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery,
    CommandStatementQuery, CommandStatementUpdate, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc,
    SchemaResult, Ticket,
};
use datafusion::arrow::record_batch::RecordBatch;
use futures::{Stream, StreamExt, TryStreamExt, stream};
use prost::Message;
use sluice_access::Grant;
use sluice_access::auth::principal_of;
use sluice_flight::ticket::QueryTicket;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};

use crate::queries::Queries;

use self::catalog_commands::Catalog;
use self::read_only::{refuse_writes, refused_update};

mod catalog_commands;
mod headers;
mod read_only;

/// The catalog and schema every dataset is in (DataFusion's defaults,
/// which the SQL resolves a bare table name against).
pub const CATALOG: &str = "datafusion";
/// See [`CATALOG`].
pub const SCHEMA: &str = "public";
/// The one table type.
pub const TABLE_TYPE: &str = "TABLE";

const PREFIX: &str = "type.googleapis.com/arrow.flight.protocol.sql.";

/// Actions of the Flight SQL protocol (which this service answers or
/// refuses with a Flight SQL error).
pub const ACTIONS: [&str; 8] = [
    "CreatePreparedStatement",
    "ClosePreparedStatement",
    "CreatePreparedSubstraitPlan",
    "BeginTransaction",
    "EndTransaction",
    "BeginSavepoint",
    "EndSavepoint",
    "CancelQuery",
];

/// A request this service cannot answer as asked (kind
/// `invalid_request`).
fn invalid(why: impl std::fmt::Display) -> Status {
    sluice_base::fault::status_with(Code::InvalidArgument, "invalid_request", &why.to_string())
}

/// An error of ours or of the Arrow library while answering (kind
/// `internal`).
fn internal(e: &dyn std::fmt::Display) -> Status {
    sluice_base::fault::status_with(Code::Internal, "internal", &e.to_string())
}

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Whether `bytes` (a ticket, or a descriptor's command) is a Flight SQL
/// message: sluice's own tickets are JSON, job ids and paths are text.
pub fn is_flight_sql(bytes: &[u8]) -> bool {
    Any::decode(bytes).is_ok_and(|a| a.type_url.starts_with(PREFIX))
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct SqlService {
    queries: Queries,
}

impl SqlService {
    /// Flight SQL over the queries of `queries`.
    pub fn new(queries: Queries) -> Self {
        Self { queries }
    }

    /// The query ticket of `sql` under the options of `headers`.
    fn ticket(&self, sql: String, headers: &MetadataMap) -> Result<QueryTicket, Status> {
        refuse_writes(&sql)?;
        let (offload, udf) = headers::options(headers, self.queries.session().limits())?;
        Ok(self.queries.capped(QueryTicket { sql, offload, udf }))
    }

    /// A statement handle: the ticket, as JSON.
    fn handle(t: &QueryTicket) -> Result<Vec<u8>, Status> {
        serde_json::to_vec(t).map_err(|e| internal(&e))
    }

    /// The ticket a handle names (the server's limits applied again: a
    /// handle comes back from the client).
    fn ticket_of(&self, handle: &[u8]) -> Result<QueryTicket, Status> {
        let t: QueryTicket = serde_json::from_slice(handle)
            .map_err(|e| invalid(format!("not a statement handle of this server: {e}")))?;
        Ok(self.queries.capped(t))
    }

    /// A FlightInfo of `schema` whose one endpoint's ticket is `ticket`.
    fn info(
        schema: &Schema,
        descriptor: FlightDescriptor,
        ticket: Vec<u8>,
    ) -> Result<Response<FlightInfo>, Status> {
        let info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(|e| internal(&e))?
            .with_descriptor(descriptor)
            .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
            .with_ordered(true);
        Ok(Response::new(info))
    }

    /// The rows of a ticket, without the closing report.
    async fn rows(
        &self,
        who: &Grant,
        t: QueryTicket,
    ) -> Result<Response<Boxed<FlightData>>, Status> {
        let messages = self.queries.run(who, t).await?;
        let rows = messages.filter(|m| {
            let report =
                matches!(m, Ok(d) if d.data_header.is_empty() && !d.app_metadata.is_empty());
            futures::future::ready(!report)
        });
        Ok(Response::new(Box::pin(rows)))
    }

    /// The FlightInfo of a catalog command: its result's schema, and the
    /// command itself as the ticket.
    fn catalog_info(
        query: Catalog,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.schema()?;
        Self::info(&schema, request.into_inner(), query.ticket())
    }

    /// The rows of a catalog command, as the caller may see them.
    async fn catalog_rows(
        &self,
        query: Catalog,
        request: Request<Ticket>,
    ) -> Result<Response<Boxed<FlightData>>, Status> {
        let batch = query.rows(&self.queries, &principal_of(&request)).await?;
        let schema = batch.schema();
        let stream = arrow_flight::encode::FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(stream::once(async { Ok(batch) }))
            .map(|r| r.map_err(|e| internal(&e)));
        Ok(Response::new(Box::pin(stream)))
    }

    /// `GetSchema` of a Flight SQL command: a statement's or a prepared
    /// statement's result schema (planned, not run).
    pub async fn schema(&self, request: Request<FlightDescriptor>) -> Result<SchemaResult, Status> {
        let any = Any::decode(&*request.get_ref().cmd)
            .map_err(|e| invalid(format!("bad Flight SQL command: {e}")))?;
        let t = match Command::try_from(any).map_err(|e| invalid(e.to_string()))? {
            Command::CommandStatementQuery(q) => self.ticket(q.query, request.metadata())?,
            Command::CommandPreparedStatementQuery(p) => {
                self.ticket_of(&p.prepared_statement_handle)?
            }
            other => {
                return Err(invalid(format!(
                    "GetSchema answers statements and prepared statements, not {}",
                    other.type_url()
                )));
            }
        };
        let schema = self.queries.schema_of(&principal_of(&request), t).await?;
        SchemaAsIpc::new(&schema, &IpcWriteOptions::default())
            .try_into()
            .map_err(|e: arrow::error::ArrowError| internal(&e))
    }

    /// Binds the parameters a client put for a prepared statement (the
    /// first row of `data`'s batches): the answer carries the statement
    /// with its values, the handle the client uses from then on
    /// (`crate::sql_params`).
    pub async fn bind_parameters(
        &self,
        cmd: &[u8],
        data: impl Stream<Item = Result<FlightData, Status>> + Send + 'static,
    ) -> Result<arrow_flight::PutResult, Status> {
        let any = Any::decode(cmd).map_err(|e| invalid(format!("bad Flight SQL command: {e}")))?;
        let prepared = match Command::try_from(any).map_err(|e| invalid(e.to_string()))? {
            Command::CommandPreparedStatementQuery(p) => p,
            _ => return Err(refused_update()),
        };
        let t = self.ticket_of(&prepared.prepared_statement_handle)?;
        let batches: Vec<RecordBatch> =
            arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
                data.map_err(arrow_flight::error::FlightError::from),
            )
            .try_collect()
            .await
            .map_err(|e| invalid(format!("cannot read the parameters: {e}")))?;
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let Some(batch) = batches.iter().find(|b| b.num_rows() > 0) else {
            return Err(invalid("no parameter values were sent"));
        };
        if rows > 1 {
            return Err(invalid(format!(
                "{rows} rows of parameters: sluice binds one row per execution"
            )));
        }
        let values = batch
            .columns()
            .iter()
            .map(|c| datafusion::common::ScalarValue::try_from_array(c, 0))
            .collect::<datafusion::error::Result<Vec<_>>>()
            .map_err(|e| invalid(e.to_string()))?;
        let sql = crate::sql_params::bind(&t.sql, &values).map_err(|e| invalid(e.to_string()))?;
        let bound = QueryTicket { sql, ..t };
        let result = arrow_flight::sql::DoPutPreparedStatementResult {
            prepared_statement_handle: Some(Self::handle(&bound)?.into()),
        };
        Ok(arrow_flight::PutResult {
            app_metadata: result.encode_to_vec().into(),
        })
    }
}

fn schema_bytes(schema: &Schema) -> Result<Vec<u8>, Status> {
    let message: IpcMessage = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(|e: arrow::error::ArrowError| internal(&e))?;
    Ok(message.0.to_vec())
}

#[tonic::async_trait]
impl FlightSqlService for SqlService {
    type FlightService = SqlService;

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let t = self.ticket(query.query, request.metadata())?;
        let schema = self
            .queries
            .schema_of(&principal_of(&request), t.clone())
            .await?;
        let handle = Self::handle(&t)?;
        let ticket = TicketStatementQuery {
            statement_handle: handle.into(),
        };
        Self::info(
            &schema,
            request.into_inner(),
            ticket.as_any().encode_to_vec(),
        )
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<Boxed<FlightData>>, Status> {
        let t = self.ticket_of(&ticket.statement_handle)?;
        self.rows(&principal_of(&request), t).await
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<arrow_flight::Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let t = self.ticket(query.query, request.metadata())?;
        // A statement with parameters is planned once they are bound (its
        // result's schema then comes with its FlightInfo).
        let dataset_schema = if crate::sql_params::placeholders(&t.sql) > 0 {
            Default::default()
        } else {
            let schema = self
                .queries
                .schema_of(&principal_of(&request), t.clone())
                .await?;
            schema_bytes(&schema)?.into()
        };
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: Self::handle(&t)?.into(),
            dataset_schema,
            parameter_schema: Default::default(),
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<(), Status> {
        // A handle is the statement itself: nothing is held to free.
        Ok(())
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let t = self.ticket_of(&cmd.prepared_statement_handle)?;
        let schema = self.queries.schema_of(&principal_of(&request), t).await?;
        Self::info(&schema, request.into_inner(), cmd.as_any().encode_to_vec())
    }

    async fn do_get_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<Boxed<FlightData>>, Status> {
        let t = self.ticket_of(&cmd.prepared_statement_handle)?;
        self.rows(&principal_of(&request), t).await
    }

    async fn do_put_prepared_statement_query(
        &self,
        _query: CommandPreparedStatementQuery,
        _request: Request<arrow_flight::sql::server::PeekableFlightDataStream>,
    ) -> Result<arrow_flight::sql::DoPutPreparedStatementResult, Status> {
        // The service's DoPut binds parameters itself (`bind_parameters`),
        // before this trait would see the stream.
        Err(internal(&"parameters are bound by QueryService::do_put"))
    }

    async fn do_put_statement_update(
        &self,
        _ticket: CommandStatementUpdate,
        _request: Request<arrow_flight::sql::server::PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(refused_update())
    }

    // The catalog commands: one handler (`catalog_commands`), a line each here.
    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Self::catalog_info(Catalog::Catalogs(query), request)
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> Result<Response<Boxed<FlightData>>, Status> {
        self.catalog_rows(Catalog::Catalogs(query), request).await
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Self::catalog_info(Catalog::Schemas(query), request)
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> Result<Response<Boxed<FlightData>>, Status> {
        self.catalog_rows(Catalog::Schemas(query), request).await
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Self::catalog_info(Catalog::Tables(query), request)
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> Result<Response<Boxed<FlightData>>, Status> {
        self.catalog_rows(Catalog::Tables(query), request).await
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Self::catalog_info(Catalog::TableTypes(query), request)
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> Result<Response<Boxed<FlightData>>, Status> {
        self.catalog_rows(Catalog::TableTypes(query), request).await
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Self::catalog_info(Catalog::SqlInfo(query), request)
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> Result<Response<Boxed<FlightData>>, Status> {
        self.catalog_rows(Catalog::SqlInfo(query), request).await
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_flight_sql_messages_are_taken_for_flight_sql() {
        let cmd = CommandStatementQuery {
            query: "SELECT 1".into(),
            transaction_id: None,
        };
        assert!(is_flight_sql(&cmd.as_any().encode_to_vec()));
        assert!(!is_flight_sql(br#"{"sql": "SELECT 1"}"#));
        assert!(!is_flight_sql(b"job-1-abc"));
        assert!(!is_flight_sql(b""));
    }
}
