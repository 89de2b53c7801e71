//! The catalog commands of Flight SQL as one thing: [`Catalog`], each
//! command's result schema, its ticket and its rows — the catalog, the
//! schema, the datasets as tables (each under its name, and each node's
//! latest version as `name@V`, only those the caller may read), the one
//! table type, and what the server is (`GetSqlInfo`).

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTableTypes,
    CommandGetTables, ProstMessageExt, SqlInfo,
};
use datafusion::arrow::record_batch::RecordBatch;
use prost::Message;
use sluice_access::Grant;
use tonic::Status;

use super::{CATALOG, SCHEMA, TABLE_TYPE, internal};
use crate::queries::Queries;

/// A catalog command.
#[derive(Debug, Clone)]
pub enum Catalog {
    /// `GetCatalogs`.
    Catalogs(CommandGetCatalogs),
    /// `GetDbSchemas`.
    Schemas(CommandGetDbSchemas),
    /// `GetTables`.
    Tables(CommandGetTables),
    /// `GetTableTypes`.
    TableTypes(CommandGetTableTypes),
    /// `GetSqlInfo`.
    SqlInfo(CommandGetSqlInfo),
}

impl Catalog {
    /// The schema of its result.
    pub fn schema(&self) -> Result<SchemaRef, Status> {
        Ok(match self.clone() {
            Self::Catalogs(q) => q.into_builder().schema(),
            Self::Schemas(q) => q.into_builder().schema(),
            Self::Tables(q) => q.into_builder().schema(),
            Self::TableTypes(q) => q.into_builder().schema(),
            Self::SqlInfo(q) => q.into_builder(&sql_info()?).schema(),
        })
    }

    /// Its ticket: the command itself.
    pub fn ticket(&self) -> Vec<u8> {
        match self {
            Self::Catalogs(q) => q.as_any().encode_to_vec(),
            Self::Schemas(q) => q.as_any().encode_to_vec(),
            Self::Tables(q) => q.as_any().encode_to_vec(),
            Self::TableTypes(q) => q.as_any().encode_to_vec(),
            Self::SqlInfo(q) => q.as_any().encode_to_vec(),
        }
    }

    /// Its rows, for `who`, over the datasets `queries` reads.
    pub async fn rows(self, queries: &Queries, who: &Grant) -> Result<RecordBatch, Status> {
        let built = match self {
            Self::Catalogs(q) => {
                let mut b = q.into_builder();
                b.append(CATALOG);
                b.build()
            }
            Self::Schemas(q) => {
                let mut b = q.into_builder();
                b.append(CATALOG, SCHEMA);
                b.build()
            }
            Self::Tables(q) => {
                let mut b = q.into_builder();
                for (name, schema) in tables(queries).await? {
                    if who.may_read(&name) {
                        b.append(CATALOG, SCHEMA, name, TABLE_TYPE, &schema)
                            .map_err(|e| internal(&e))?;
                    }
                }
                b.build()
            }
            Self::TableTypes(q) => {
                let mut b = q.into_builder();
                b.append(TABLE_TYPE);
                b.build()
            }
            Self::SqlInfo(q) => q.into_builder(&sql_info()?).build(),
        };
        built.map_err(|e| internal(&e))
    }
}

/// The datasets as tables: each under its name, and each node's latest
/// version as `name@V`, sorted by name.
async fn tables(queries: &Queries) -> Result<Vec<(String, Arc<Schema>)>, Status> {
    let session = queries.session();
    session
        .refresh()
        .await
        .map_err(|e| sluice_base::fault::status(&e))?;
    let mut out = Vec::new();
    for (name, schema, _) in session.datasets().await {
        let mut versions: Vec<u64> = session
            .versions(&name)
            .await
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        versions.sort_unstable();
        versions.dedup();
        for v in versions {
            out.push((format!("{name}@{v}"), schema.clone()));
        }
        out.push((name, schema));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// What the server is: read-only SQL, no Substrait, transactions or
/// cancel.
fn sql_info() -> Result<SqlInfoData, Status> {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "sluice");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, "59");
    b.append(SqlInfo::FlightSqlServerReadOnly, true);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(SqlInfo::FlightSqlServerTransaction, 0i32);
    b.append(SqlInfo::FlightSqlServerCancel, false);
    b.append(SqlInfo::FlightSqlServerStatementTimeout, 0i32);
    b.append(SqlInfo::FlightSqlServerTransactionTimeout, 0i32);
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, false);
    b.append(SqlInfo::SqlDdlTable, false);
    b.build().map_err(|e| internal(&e))
}
