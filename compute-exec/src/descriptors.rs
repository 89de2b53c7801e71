//! Dataset descriptors that lead somewhere: `ListFlights` lists every
//! dataset as `FlightDescriptor::path([name])`, and a plain Flight client
//! follows it — `GetFlightInfo` of `[name]` (the latest version) or
//! `[name, version]` answers the dataset's metadata columns as schema and
//! one endpoint, whose ticket is a [`QueryTicket`] that `DoGet` streams:
//! `SELECT <every column but data> FROM "name[@version]"`. The objects
//! themselves (`data`) are read by asking for them in SQL; a descriptor
//! streams what a listing shows. `GetSchema` answers the same schema.

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::writer::IpcWriteOptions;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::{
    FlightDescriptor, FlightEndpoint, FlightInfo, SchemaAsIpc, SchemaResult, Ticket,
};
use sluice_base::fault::status_of;
use sluice_flight::ticket::QueryTicket;
use sluice_udfs::UdfEnv;
use tonic::Status;

use crate::session::ComputeSession;
use sluice_base::CallError;

/// The column that holds the objects.
const DATA: &str = "data";

/// What a dataset descriptor reads: the table name and its columns.
struct Target {
    table: String,
    schema: SchemaRef,
    samples: Option<u64>,
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The dataset `d` names, or `None` when it names none (a job, say).
async fn target(session: &ComputeSession, d: &FlightDescriptor) -> Result<Option<Target>, Status> {
    if d.r#type() != DescriptorType::Path || d.path.is_empty() || d.path.len() > 2 {
        return Ok(None);
    }
    session
        .refresh()
        .await
        .map_err(|e| sluice_base::fault::status(&e))?;
    let name = &d.path[0];
    let Some((_, latest, stats)) = session
        .datasets()
        .await
        .into_iter()
        .find(|(n, _, _)| n == name)
    else {
        return Ok(None);
    };
    let Some(version) = d.path.get(1) else {
        return Ok(Some(Target {
            table: name.clone(),
            schema: latest,
            samples: Some(stats.samples),
        }));
    };
    let version: u64 = version.parse().map_err(|_| {
        CallError::bad_request(format!(
            "descriptor [{name:?}, {version:?}]: the version is not a number"
        ))
    })?;
    let table = format!("{name}@{version}");
    let udfs = UdfEnv::new(Default::default());
    let prepared = session
        .prepare(&format!("SELECT * FROM {}", quote(&table)), &udfs)
        .await
        .map_err(|e| status_of(&e, true))?;
    Ok(Some(Target {
        table,
        schema: Arc::new(prepared.plan.schema().as_arrow().clone()),
        samples: None,
    }))
}

impl Target {
    /// The columns a descriptor streams.
    fn metadata(&self) -> Schema {
        let fields: Vec<_> = self
            .schema
            .fields()
            .iter()
            .filter(|f| f.name() != DATA)
            .cloned()
            .collect();
        Schema::new(fields)
    }

    fn ticket(&self) -> Result<Ticket, Status> {
        let cols: Vec<String> = self
            .metadata()
            .fields()
            .iter()
            .map(|f| quote(f.name()))
            .collect();
        let t = QueryTicket {
            sql: format!("SELECT {} FROM {}", cols.join(", "), quote(&self.table)),
            offload: Default::default(),
            udf: Default::default(),
        };
        Ok(Ticket::new(sluice_flight::Ticket::Query(t).to_bytes()))
    }
}

/// The Flight info of the dataset `d` names, if it names one.
pub async fn flight_info(
    session: &ComputeSession,
    d: &FlightDescriptor,
) -> Result<Option<FlightInfo>, Status> {
    let Some(t) = target(session, d).await? else {
        return Ok(None);
    };
    let mut info = FlightInfo::new()
        .try_with_schema(&t.metadata())
        .map_err(|e| CallError::encoding(e.to_string()))?
        .with_descriptor(d.clone())
        .with_endpoint(FlightEndpoint::new().with_ticket(t.ticket()?));
    if let Some(n) = t.samples {
        info = info.with_total_records(n as i64);
    }
    Ok(Some(info))
}

/// The schema of the dataset `d` names, if it names one.
pub async fn schema(
    session: &ComputeSession,
    d: &FlightDescriptor,
) -> Result<Option<SchemaResult>, Status> {
    let Some(t) = target(session, d).await? else {
        return Ok(None);
    };
    let opts = IpcWriteOptions::default();
    SchemaAsIpc::new(&t.metadata(), &opts)
        .try_into()
        .map(Some)
        .map_err(|e: arrow::error::ArrowError| CallError::encoding(e.to_string()))
}

/// NOT_FOUND for a descriptor that names neither a dataset nor a job.
pub fn not_found(d: &FlightDescriptor, job: Status) -> Status {
    if job.code() != tonic::Code::NotFound {
        return job;
    }
    let what = if d.r#type() == DescriptorType::Path {
        format!("path {:?}", d.path)
    } else {
        format!("command {:?}", String::from_utf8_lossy(&d.cmd))
    };
    CallError::NotFound(format!(
        "descriptor {what} names no dataset and no job ({})",
        job.message()
    ))
    .status()
}
