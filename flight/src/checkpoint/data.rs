//! Checkpoint bytes as they travel: batches of one `LargeBinary` column
//! `data`, each row a stretch of the checkpoint in order. The one place
//! that turns such a stream into buffers ([`pieces`]) and buffers into
//! such a stream ([`encode`]), for the store that serves a node's bytes,
//! the client that sends a node its stripes, and the coordinator between
//! them. Neither copies a row's bytes: a piece is a slice of the decoded
//! message, a row a buffer as it is.

use std::sync::Arc;

use arrow::array::{Array, LargeBinaryArray, RecordBatch};
use arrow::buffer::{Buffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::{FlightData, FlightDescriptor};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use tonic::Status;

/// The column checkpoint bytes travel in.
pub fn data_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "data",
        DataType::LargeBinary,
        false,
    )]))
}

/// The value buffers of a batch's first (binary) column, in row order,
/// empty rows left out; `Err`: why the batch is not checkpoint bytes.
fn values(batch: &RecordBatch) -> Result<Vec<Buffer>, String> {
    let col = batch
        .columns()
        .first()
        .ok_or_else(|| "a part batch has no column".to_string())?;
    let array = col
        .as_any()
        .downcast_ref::<LargeBinaryArray>()
        .ok_or_else(|| format!("part data must be LargeBinary, not {}", col.data_type()))?;
    if array.null_count() > 0 {
        return Err("part data has nulls".into());
    }
    let offsets = array.value_offsets();
    let values = array.values();
    Ok(offsets
        .windows(2)
        .map(|w| values.slice_with_length(w[0] as usize, (w[1] - w[0]) as usize))
        .filter(|b| !b.is_empty())
        .collect())
}

/// Why a stream of messages gave no bytes.
#[derive(Debug)]
pub enum PieceError {
    /// The other side's status (a checksum mismatch there stays
    /// `DATA_LOSS`), or the transport's.
    Status(Status),
    /// The messages are not checkpoint bytes: why.
    Bad(String),
}

impl std::fmt::Display for PieceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Status(s) => write!(f, "{} ({:?})", s.message(), s.code()),
            Self::Bad(reason) => f.write_str(reason),
        }
    }
}

/// The bytes a stream of Flight messages carries, as buffers in order,
/// for the caller to name its upload or node in an error.
pub fn pieces<S>(data: S) -> impl Stream<Item = Result<Buffer, PieceError>> + Send
where
    S: Stream<Item = Result<FlightData, Status>> + Send + 'static,
{
    FlightRecordBatchStream::new_from_flight_data(data.map_err(|s| FlightError::Tonic(Box::new(s))))
        .map_err(|e| match e {
            FlightError::Tonic(s) => PieceError::Status(*s),
            other => PieceError::Bad(format!("part stream: {other}")),
        })
        .and_then(|b| futures::future::ready(values(&b).map_err(PieceError::Bad)))
        .map_ok(|v| futures::stream::iter(v.into_iter().map(Ok)))
        .try_flatten()
}

/// A row of the data column holding `buf`.
fn row(schema: &SchemaRef, buf: Buffer) -> Result<RecordBatch, arrow::error::ArrowError> {
    let offsets = OffsetBuffer::from_lengths([buf.len()]);
    let array = LargeBinaryArray::try_new(offsets, buf, None)?;
    RecordBatch::try_new(Arc::clone(schema), vec![Arc::new(array)])
}

/// A part's bytes encoded once as Flight messages (one row each, the
/// schema first), to be sent to each of its holders without encoding
/// them again: the messages share their bodies.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The messages.
    pub messages: Vec<FlightData>,
    /// The bytes they carry.
    pub bytes: u64,
}

impl Encoded {
    /// `buffers` as messages.
    pub fn of(buffers: Vec<Buffer>) -> Result<Self, FlightError> {
        let schema = data_schema();
        let bytes = buffers.iter().map(|b| b.len() as u64).sum();
        let batches = buffers
            .into_iter()
            .map(|b| row(&schema, b))
            .collect::<Result<Vec<_>, _>>()?;
        let messages = arrow_flight::utils::batches_to_flight_data(&schema, batches)?;
        Ok(Self { messages, bytes })
    }
}

/// `buffers` as Flight messages (one row each), first the schema (with
/// `descriptor`, when a put names its upload); a buffer's error ends the
/// stream with its status.
pub fn encode<S>(
    buffers: S,
    descriptor: Option<FlightDescriptor>,
) -> BoxStream<'static, Result<FlightData, Status>>
where
    S: Stream<Item = Result<Buffer, Status>> + Send + 'static,
{
    let schema = data_schema();
    let batch_schema = Arc::clone(&schema);
    let batches = buffers.map(move |buf| {
        let buf = buf.map_err(|s| FlightError::Tonic(Box::new(s)))?;
        Ok(row(&batch_schema, buf)?)
    });
    FlightDataEncoderBuilder::new()
        .with_max_flight_data_size(crate::MAX_MESSAGE)
        .with_flight_descriptor(descriptor)
        .with_schema(schema)
        .build(batches)
        .map_err(|e| match e {
            FlightError::Tonic(s) => *s,
            other => sluice_base::CallError::encoding(other.to_string()),
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_come_back_as_they_went() {
        let sent: Vec<Buffer> = vec![
            Buffer::from(vec![1u8; 5]),
            Buffer::from(Vec::<u8>::new()),
            Buffer::from((0..=255u8).collect::<Vec<_>>()),
        ];
        let data = encode(
            futures::stream::iter(sent.clone().into_iter().map(Ok)),
            None,
        );
        let got: Vec<Buffer> = pieces(data).try_collect().await.unwrap();
        let flat = |b: &[Buffer]| b.iter().flat_map(|b| b.to_vec()).collect::<Vec<u8>>();
        assert_eq!(flat(&got), flat(&sent));
        assert_eq!(got.len(), 2, "an empty row is no piece");
    }

    #[tokio::test]
    async fn a_part_encoded_once_decodes_for_each_holder() {
        let sent = vec![Buffer::from(vec![7u8; 3000]), Buffer::from(vec![9u8; 5])];
        let part = Encoded::of(sent).unwrap();
        assert_eq!(part.bytes, 3005);
        for _ in 0..2 {
            let data = futures::stream::iter(part.messages.clone().into_iter().map(Ok));
            let got: Vec<Buffer> = pieces(data).try_collect().await.unwrap();
            let flat: Vec<u8> = got.iter().flat_map(|b| b.to_vec()).collect();
            assert_eq!(flat.len(), 3005);
            assert!(flat[..3000].iter().all(|&b| b == 7) && flat[3000..] == [9; 5]);
        }
    }

    #[tokio::test]
    async fn a_batch_of_another_type_is_named() {
        let schema = Arc::new(Schema::new(vec![Field::new("data", DataType::Utf8, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(arrow::array::StringArray::from(vec!["x"]))],
        )
        .unwrap();
        let data = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(futures::stream::iter([Ok(batch)]))
            .map_err(|e| Status::internal(e.to_string()));
        let err = pieces(data).try_collect::<Vec<_>>().await.unwrap_err();
        assert!(
            err.to_string().contains("must be LargeBinary, not Utf8"),
            "{err}"
        );
    }
}
