//! Arrow IPC record-batch messages whose body is the batch's own buffers.
//!
//! arrow-rs's IPC writer copies every buffer of a batch into one `Vec`
//! (the message body), and tonic's protobuf encoder copies that again into
//! the gRPC frame. Arrow's C++ Flight server does neither: it hands gRPC
//! the buffers as slices. `crate::gather::encode_batch` does the same: it writes
//! the flatbuffer header (field nodes and buffer offsets, as the IPC format
//! lays them out) and returns the body as a list of [`Bytes`] that borrow
//! the arrays' memory — no byte of a tensor or an image is copied. The
//! layout is [`crate::gather`]'s, for the batch's rows in order (one run):
//! only what the format forces is made anew (bitmaps, offsets rebased to
//! start at 0 because the batch is a slice). Types outside what this
//! writes (dictionaries, unions, run-end and view types, maps) go through
//! arrow's own encoder, one copy, with the same result on the wire.

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::DataType;
use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use arrow::ipc::{self, MetadataVersion};
use arrow_flight::FlightData;
use bytes::Bytes;
use flatbuffers::FlatBufferBuilder;

use crate::piece::Piece;

/// One Flight message: an IPC flatbuffer header, its body in pieces (each
/// buffer followed by its padding to 8 bytes; a piece may be computed where
/// it is written, see [`Piece`]), and app metadata.
#[derive(Debug, Clone, Default)]
pub struct SlicedMessage {
    /// The IPC `Message` flatbuffer (FlightData's `data_header`).
    pub header: Bytes,
    /// The body (FlightData's `data_body`) as consecutive pieces.
    pub body: Vec<Piece>,
    /// FlightData's `app_metadata`.
    pub app_metadata: Bytes,
}

impl SlicedMessage {
    /// Bytes of the body.
    pub fn body_len(&self) -> usize {
        self.body.iter().map(Piece::len).sum()
    }

    /// Whether a piece of its body is computed where it is written.
    pub fn has_computed(&self) -> bool {
        self.body.iter().any(Piece::is_computed)
    }

    /// The message with its computed pieces made into bytes (for a
    /// consumer that sends bytes: call it off the runtime that serves
    /// streams, the pieces run a stage).
    pub fn made(self) -> Self {
        if !self.has_computed() {
            return self;
        }
        Self {
            body: self
                .body
                .into_iter()
                .map(|p| match p {
                    Piece::Computed { .. } => Piece::Bytes(p.to_bytes()),
                    bytes => bytes,
                })
                .collect(),
            ..self
        }
    }

    /// Writes its body, piece after piece, into `dst` (of
    /// [`SlicedMessage::body_len`] bytes): a computed piece writes its
    /// values there, once.
    pub fn write_body(&self, dst: &mut [u8]) {
        let mut at = 0;
        for p in &self.body {
            p.write_to(&mut dst[at..at + p.len()]);
            at += p.len();
        }
    }

    /// The message as a [`FlightData`] for tonic's encoder (the body is
    /// copied into one buffer: the path for clients the direct one does
    /// not serve).
    pub fn to_flight_data(&self) -> FlightData {
        let body = match self.body.as_slice() {
            [] => Bytes::new(),
            [one] => one.to_bytes(),
            _ => {
                let mut out = vec![0u8; self.body_len()];
                self.write_body(&mut out);
                Bytes::from(out)
            }
        };
        FlightData::new()
            .with_data_header(self.header.clone())
            .with_data_body(body)
            .with_app_metadata(self.app_metadata.clone())
    }
}

impl From<FlightData> for SlicedMessage {
    fn from(d: FlightData) -> Self {
        Self {
            header: d.data_header,
            body: if d.data_body.is_empty() {
                Vec::new()
            } else {
                vec![Piece::Bytes(d.data_body)]
            },
            app_metadata: d.app_metadata,
        }
    }
}

pub(crate) const ALIGN: usize = 8;
pub(crate) static PADDING: [u8; ALIGN] = [0; ALIGN];

/// An Arrow buffer as the owner of a [`Bytes`].
struct Owned(Buffer);

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// The bytes of an Arrow buffer, sharing its memory.
pub(crate) fn bytes_of(b: Buffer) -> Bytes {
    Bytes::from_owner(Owned(b))
}

/// Whether this module writes arrays of `t` itself.
pub(crate) fn supported(t: &DataType) -> bool {
    match t {
        DataType::Null
        | DataType::Boolean
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::FixedSizeBinary(_) => true,
        t if t.is_primitive() => true,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            supported(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().all(|f| supported(f.data_type())),
        _ => false,
    }
}

/// The IPC `Message` flatbuffer of a record batch of `rows` rows whose
/// body (`body_len` bytes) is laid out as `nodes` and `buffers` say.
pub(crate) fn header(
    rows: usize,
    nodes: &[ipc::FieldNode],
    buffers: &[ipc::Buffer],
    body_len: usize,
) -> Bytes {
    let mut fbb = FlatBufferBuilder::new();
    let nodes = fbb.create_vector(nodes);
    let buffers = fbb.create_vector(buffers);
    let mut rb = ipc::RecordBatchBuilder::new(&mut fbb);
    rb.add_length(rows as i64);
    rb.add_nodes(nodes);
    rb.add_buffers(buffers);
    let rb = rb.finish();
    let mut m = ipc::MessageBuilder::new(&mut fbb);
    m.add_version(MetadataVersion::V5);
    m.add_header_type(ipc::MessageHeader::RecordBatch);
    m.add_bodyLength(body_len as i64);
    m.add_header(rb.as_union_value());
    let m = m.finish();
    fbb.finish(m, None);
    Bytes::copy_from_slice(fbb.finished_data())
}

/// arrow's own encoder, for the types [`encode_batch`] does not write.
pub(crate) fn encode_copied(
    batch: &RecordBatch,
) -> Result<SlicedMessage, arrow::error::ArrowError> {
    let mut tracker = DictionaryTracker::new(false);
    let (dicts, data) = IpcDataGenerator::default().encode(
        batch,
        &mut tracker,
        &IpcWriteOptions::default(),
        &mut IpcWriteContext::default(),
    )?;
    if !dicts.is_empty() {
        return Err(arrow::error::ArrowError::NotYetImplemented(
            "dictionary-encoded columns in a sliced Flight stream".into(),
        ));
    }
    Ok(SlicedMessage {
        header: Bytes::from(data.ipc_message),
        body: vec![Piece::Bytes(Bytes::from(data.arrow_data))],
        app_metadata: Bytes::new(),
    })
}

/// A batch of every layout the bodies handle, and a message read back as a
/// batch: what the tests of `slices` and `gather` build on.
#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use arrow::array::Array;

    use arrow::array::{
        ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Int64Array, LargeBinaryArray,
        ListArray, StringArray, StructArray,
    };
    use arrow::buffer::OffsetBuffer;
    use arrow::datatypes::{Field, Fields, Int32Type, Schema};
    use arrow::ipc::reader::read_record_batch;
    use arrow::ipc::root_as_message;

    use super::*;

    pub(crate) fn batch() -> RecordBatch {
        let n = 37;
        let floats = Float32Array::from_iter_values((0..n * 6).map(|i| i as f32 * 0.5));
        let tensor = FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            6,
            Arc::new(floats),
            None,
        );
        let keys = StringArray::from_iter((0..n).map(|i| (i % 5 != 3).then(|| format!("k{i}"))));
        let blobs = LargeBinaryArray::from_iter_values((0..n).map(|i| vec![i as u8; i % 7]));
        let flags = BooleanArray::from_iter((0..n).map(|i| (i % 4 != 0).then_some(i % 3 == 0)));
        let ids = Int64Array::from_iter((0..n).map(|i| (i % 6 != 1).then_some(i as i64 * 3)));
        let lists = ListArray::from_iter_primitive::<Int32Type, _, _>(
            (0..n).map(|i| (i % 9 != 2).then(|| (0..i % 4).map(|j| Some(j as i32)))),
        );
        let pair = StructArray::new(
            Fields::from(vec![
                Field::new("a", DataType::Int64, true),
                Field::new("b", DataType::Utf8, true),
            ]),
            vec![
                Arc::new(ids.clone()) as ArrayRef,
                Arc::new(keys.clone()) as ArrayRef,
            ],
            None,
        );
        // Structs inside a list, which a slice of the batch reaches at an
        // offset: arrow slices a struct's children with it.
        let lengths: Vec<usize> = (0..n).map(|i| i % 3).collect();
        let inner = StructArray::new(
            Fields::from(vec![Field::new("x", DataType::Int64, true)]),
            vec![Arc::new(Int64Array::from_iter(
                (0..lengths.iter().sum::<usize>()).map(|i| (i % 5 != 4).then_some(i as i64)),
            )) as ArrayRef],
            None,
        );
        let pairs = ListArray::new(
            Arc::new(Field::new("item", inner.data_type().clone(), true)),
            OffsetBuffer::from_lengths(lengths),
            Arc::new(inner),
            None,
        );
        let cols: Vec<ArrayRef> = vec![
            Arc::new(pairs),
            Arc::new(keys),
            Arc::new(tensor),
            Arc::new(blobs),
            Arc::new(flags),
            Arc::new(ids),
            Arc::new(lists),
            Arc::new(pair),
        ];
        let schema = Schema::new(
            cols.iter()
                .enumerate()
                .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
                .collect::<Vec<_>>(),
        );
        RecordBatch::try_new(Arc::new(schema), cols).unwrap()
    }

    pub(crate) fn decode(m: &SlicedMessage, schema: &Arc<Schema>) -> RecordBatch {
        let body: Vec<u8> = m.body.iter().flat_map(|b| b.to_bytes()).collect();
        let msg = root_as_message(&m.header).unwrap();
        assert_eq!(msg.bodyLength() as usize, body.len());
        let rb = msg.header_as_record_batch().unwrap();
        read_record_batch(
            &Buffer::from(body),
            rb,
            schema.clone(),
            &Default::default(),
            None,
            &msg.version(),
        )
        .unwrap()
    }
}
