//! A storage fragment's report, and how it travels in band: after the
//! fragment's rows, as one last row of its output (see the module docs of
//! [`crate::fragment`]).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, new_null_array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{Result, exec_err};
use datafusion::error::DataFusionError;
use serde::{Deserialize, Serialize};
use sluice_base::BadSample;
use sluice_udfs::StageTiming;

/// The report column of a fragment's output.
pub const REPORT: &str = "__report";

/// What a fragment's run met, sent after its last batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FragmentReport {
    /// Bad samples (skipped or nulled), up to the log's cap.
    pub bad: Vec<BadSample>,
    /// How many there were in all.
    pub bad_total: u64,
    /// Rows sent.
    pub rows: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Where the fragment's UDF time went (absent from nodes older than
    /// per-stage statistics).
    #[serde(default)]
    pub stages: Vec<StageTiming>,
    /// The node that ran it, when the transport does not name it (an
    /// engine task's report, in band).
    #[serde(default)]
    pub node: String,
    /// Why the window failed, when it did: its status as the node would
    /// have answered it (the windows of a job on the engine end with their
    /// error in band, so its kind survives the engine's transport).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<FailedWith>,
}

/// A status on the wire: its code, message and details (sluice's kind).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FailedWith {
    /// The gRPC code, as a number.
    pub code: i32,
    /// Its message.
    pub message: String,
    /// Its details (the status's detail bytes).
    pub details: Vec<u8>,
}

impl FragmentReport {
    /// What the UDFs of `udfs` met while `rows` rows (`bytes` bytes) were
    /// sent: their bad samples and stage times.
    pub fn of(udfs: &sluice_udfs::UdfEnv, rows: u64, bytes: u64) -> Self {
        let (bad_total, bad) = udfs.errors.snapshot();
        Self {
            bad,
            bad_total,
            rows,
            bytes,
            stages: udfs.clock.snapshot(),
            node: String::new(),
            failed: None,
        }
    }

    /// What was added since `before`, an earlier report of the same run:
    /// the bad samples and stage times a window of a feed met (a feed's
    /// UDFs count for all its windows). Rows and bytes are `self`'s.
    pub fn since(&self, before: &FragmentReport) -> FragmentReport {
        let stages = self
            .stages
            .iter()
            .map(|s| {
                let had = before
                    .stages
                    .iter()
                    .find(|b| b.site == s.site && b.udf == s.udf);
                StageTiming {
                    site: s.site.clone(),
                    udf: s.udf.clone(),
                    tally: had.map_or_else(|| s.tally.clone(), |b| s.tally.since(&b.tally)),
                }
            })
            .filter(|s| s.tally.calls > 0 || s.tally.rows > 0)
            .collect();
        FragmentReport {
            bad: self.bad.iter().skip(before.bad.len()).cloned().collect(),
            bad_total: self.bad_total.saturating_sub(before.bad_total),
            rows: self.rows,
            bytes: self.bytes,
            stages,
            node: self.node.clone(),
            failed: self.failed.clone(),
        }
    }
}

impl FailedWith {
    /// The status a fragment's failure `e` answers: the node's own status
    /// where it failed as one, else the mapping every fragment's errors
    /// take.
    pub fn status_of(e: &DataFusionError) -> tonic::Status {
        match e {
            DataFusionError::External(inner) => match inner.downcast_ref::<tonic::Status>() {
                Some(s) => s.clone(),
                None => sluice_base::fault::status_of(e, false),
            },
            _ => sluice_base::fault::status_of(e, false),
        }
    }

    /// `e` on the wire.
    pub fn of(e: &DataFusionError) -> Self {
        let status = Self::status_of(e);
        Self {
            code: status.code() as i32,
            message: status.message().to_string(),
            details: status.details().to_vec(),
        }
    }

    /// The status it carries.
    pub fn status(&self) -> tonic::Status {
        tonic::Status::with_details(
            tonic::Code::from_i32(self.code),
            self.message.clone(),
            self.details.clone().into(),
        )
    }
}

/// The bytes of `batch`'s Arrow values: what crosses a link for it.
pub fn link_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
        .sum()
}

/// `schema` as a fragment sends it: every column nullable, then [`REPORT`].
pub fn reported_schema(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    fields.push(Field::new(REPORT, DataType::Utf8, true));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// What one batch of a fragment's output is, once the report column is
/// taken off: rows of `rows_schema`, or the fragment's report.
#[derive(Debug)]
pub enum Received {
    /// Rows.
    Rows(RecordBatch),
    /// The report that ends the fragment.
    Report(FragmentReport),
}

/// Splits a batch of a fragment's output (see the module docs).
pub fn split_report(batch: &RecordBatch, rows_schema: &SchemaRef) -> Result<Received> {
    let n = batch.num_columns();
    if n == 0 {
        return exec_err!("a storage fragment's output lacks its report column");
    }
    let Some(report) = batch.column(n - 1).as_any().downcast_ref::<StringArray>() else {
        return exec_err!("a storage fragment's output lacks its report column");
    };
    if report.null_count() < report.len() {
        let json = (0..report.len())
            .find(|&i| report.is_valid(i))
            .map(|i| report.value(i))
            .unwrap_or_default();
        let r = serde_json::from_str(json)
            .map_err(|e| DataFusionError::Execution(format!("a fragment's bad report: {e}")))?;
        return Ok(Received::Report(r));
    }
    let columns: Vec<ArrayRef> = batch.columns()[..n - 1].to_vec();
    Ok(Received::Rows(RecordBatch::try_new(
        Arc::clone(rows_schema),
        columns,
    )?))
}

/// The report row that ends a fragment's output of `schema`.
pub fn report_batch(schema: &SchemaRef, report: &FragmentReport) -> Result<RecordBatch> {
    let json = serde_json::to_string(report)
        .map_err(|e| DataFusionError::Execution(format!("cannot encode a report: {e}")))?;
    let n = schema.fields().len();
    let mut columns: Vec<ArrayRef> = schema.fields()[..n - 1]
        .iter()
        .map(|f| new_null_array(f.data_type(), 1))
        .collect();
    columns.push(Arc::new(StringArray::from(vec![json])));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// `batch` (the fragment's rows) as its output of `schema` sends it.
pub fn with_report_column(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let mut columns = batch.columns().to_vec();
    columns.push(new_null_array(&DataType::Utf8, batch.num_rows()));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int32Array;

    #[test]
    fn a_report_row_is_taken_off_and_rows_keep_their_schema() {
        let rows_schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
        let wire = reported_schema(&rows_schema);
        assert!(wire.field(0).is_nullable());
        let rows = RecordBatch::try_new(
            Arc::clone(&rows_schema),
            vec![Arc::new(Int32Array::from(vec![1, 2]))],
        )
        .unwrap();
        let sent = with_report_column(rows.clone(), &wire).unwrap();
        match split_report(&sent, &rows_schema).unwrap() {
            Received::Rows(b) => assert_eq!(b, rows),
            Received::Report(_) => panic!("rows read as a report"),
        }
        let report = FragmentReport {
            bad_total: 3,
            rows: 2,
            ..Default::default()
        };
        let last = report_batch(&wire, &report).unwrap();
        match split_report(&last, &rows_schema).unwrap() {
            Received::Report(r) => assert_eq!((r.bad_total, r.rows), (3, 2)),
            Received::Rows(_) => panic!("the report read as rows"),
        }
        let no_report = RecordBatch::try_new(
            Arc::clone(&rows_schema),
            vec![Arc::new(Int32Array::from(vec![1]))],
        )
        .unwrap();
        assert!(split_report(&no_report, &rows_schema).is_err());
    }
}
