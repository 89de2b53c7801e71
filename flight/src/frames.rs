//! Flight messages written as gRPC frames by hand, so that a message's body
//! reaches HTTP/2 as the slices [`crate::slices`] made.
//!
//! tonic encodes a response message with prost into one frame buffer: the
//! whole IPC body is copied once more there. A `FlightData` is simple
//! enough to frame directly — the 5-byte gRPC prefix, the protobuf tags and
//! lengths of `data_header`, `app_metadata` and `data_body`, then the
//! body's pieces — and hyper's HTTP/2 sends each [`Bytes`] as it is (large
//! DATA payloads are written with vectored I/O, not copied into its
//! buffer). The stream ends with gRPC trailers carrying its status, as
//! tonic would send them. Clients see ordinary `FlightData` messages.

use bytes::{BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt, stream};
use http::{HeaderMap, HeaderValue};
use http_body::Frame;
use http_body_util::StreamBody;
use tonic::Status;

use crate::slices::SlicedMessage;

/// FlightData's `data_header` (field 2, length-delimited).
const DATA_HEADER: u64 = (2 << 3) | 2;
/// FlightData's `app_metadata` (field 3, length-delimited).
const APP_METADATA: u64 = (3 << 3) | 2;
/// FlightData's `data_body` (field 1000, length-delimited).
const DATA_BODY: u64 = (1000 << 3) | 2;

fn varint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn field_len(tag: u64, len: usize) -> usize {
    varint_len(tag) + varint_len(len as u64) + len
}

/// Body pieces shorter than this (offsets, bitmaps, padding) are copied
/// next to their neighbours instead of going out as HTTP/2 DATA frames of
/// their own; longer ones (the values) are sent as they are.
const COPY_BELOW: usize = 4096;

/// The gRPC frame of `m`: a prefix with the protobuf fields before the
/// body, then the body's pieces (see [`COPY_BELOW`]).
pub fn frame(m: &SlicedMessage) -> Vec<Bytes> {
    let body = m.body_len();
    let fields = [(DATA_HEADER, &m.header), (APP_METADATA, &m.app_metadata)];
    let mut proto: usize = fields
        .iter()
        .filter(|(_, b)| !b.is_empty())
        .map(|(tag, b)| field_len(*tag, b.len()))
        .sum();
    if body > 0 {
        proto += field_len(DATA_BODY, body);
    }
    let mut head = BytesMut::with_capacity(5 + proto - body);
    head.put_u8(0); // not compressed
    head.put_u32(proto as u32);
    for (tag, bytes) in fields.into_iter().filter(|(_, b)| !b.is_empty()) {
        varint(&mut head, tag);
        varint(&mut head, bytes.len() as u64);
        head.put_slice(bytes);
    }
    if body > 0 {
        varint(&mut head, DATA_BODY);
        varint(&mut head, body as u64);
    }
    let mut out = Vec::new();
    for piece in &m.body {
        let piece = piece.to_bytes();
        if piece.len() < COPY_BELOW {
            head.put_slice(&piece);
        } else {
            if !head.is_empty() {
                out.push(head.split().freeze());
            }
            out.push(piece);
        }
    }
    if !head.is_empty() {
        out.push(head.freeze());
    }
    out
}

/// The trailers that end a response with `status`.
fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", HeaderValue::from_static("13"));
    }
    map
}

/// A gRPC response streaming `messages` as frames (see the module docs):
/// an error ends the stream with its status in the trailers.
pub fn response<S>(messages: S) -> http::Response<tonic::body::Body>
where
    S: Stream<Item = Result<SlicedMessage, Status>> + Send + 'static,
{
    let frames = stream::unfold(
        (Box::pin(messages), false),
        |(mut messages, done)| async move {
            if done {
                return None;
            }
            let (frames, done) = match messages.next().await {
                Some(Ok(m)) => (frame(&m).into_iter().map(Frame::data).collect(), false),
                Some(Err(s)) => (vec![Frame::trailers(trailers(&s))], true),
                None => (vec![Frame::trailers(trailers(&Status::ok("")))], true),
            };
            Some((frames, (messages, done)))
        },
    )
    .flat_map(|frames: Vec<Frame<Bytes>>| stream::iter(frames.into_iter().map(Ok::<_, Status>)));
    let mut response = http::Response::new(tonic::body::Body::new(StreamBody::new(frames)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

#[cfg(test)]
mod tests {
    use arrow_flight::FlightData;
    use prost::Message;

    use super::*;
    use crate::piece::Piece;

    #[test]
    fn a_frame_is_the_protobuf_flight_data_prost_would_write() {
        let body: Vec<Piece> = vec![
            Bytes::from(vec![7u8; 300]).into(),
            Bytes::from_static(&[0; 4]).into(),
            Bytes::from(vec![9u8; 70_000]).into(),
            Piece::Computed(crate::finish::Finished::new(
                std::sync::Arc::new(crate::piece::tests::Triple),
                vec![std::sync::Arc::new(arrow::array::UInt8Array::from(
                    vec![1u8; 5000],
                ))],
                vec![(0, 0, 5000)],
            )),
        ];
        for (header, meta, body) in [
            (Bytes::from_static(b"hdr"), Bytes::new(), body.clone()),
            (
                Bytes::from(vec![1u8; 200]),
                Bytes::from_static(b"{\"from\":3}"),
                body,
            ),
            (Bytes::from_static(b"schema"), Bytes::new(), Vec::new()),
            (Bytes::new(), Bytes::from_static(b"{}"), Vec::new()),
        ] {
            let m = SlicedMessage {
                header,
                body,
                app_metadata: meta,
            };
            let pieces = frame(&m);
            // The values go out as they are; the small pieces travel with
            // the prefix.
            for big in m.body.iter().filter_map(|b| b.as_bytes()) {
                if big.len() >= COPY_BELOW {
                    assert!(pieces.iter().any(|p| p.as_ptr() == big.as_ptr()));
                }
            }
            assert!(
                pieces.len() <= 1 + 2 * m.body.iter().filter(|b| b.len() >= COPY_BELOW).count()
            );
            let wire: Vec<u8> = pieces.concat();
            assert_eq!(wire[0], 0);
            let len = u32::from_be_bytes(wire[1..5].try_into().unwrap()) as usize;
            assert_eq!(len, wire.len() - 5);
            let want = m.to_flight_data();
            assert_eq!(FlightData::decode(&wire[5..]).unwrap(), want);
            assert_eq!(&wire[5..], want.encode_to_vec().as_slice());
        }
    }

    #[test]
    fn varints_are_sized_right() {
        for v in [0, 1, 127, 128, 16_383, 16_384, u32::MAX as u64, u64::MAX] {
            let mut b = BytesMut::new();
            varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
        }
    }
}
