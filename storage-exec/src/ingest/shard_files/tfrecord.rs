//! TFRecord files of `tf.train.Example`: ImageNet as most TensorFlow
//! pipelines hold it.
//!
//! A file is a run of records, each
//!
//! ```text
//!   u64 length (little-endian) · u32 masked CRC-32C of the length
//!   length bytes of data       · u32 masked CRC-32C of the data
//! ```
//!
//! where a masked CRC is `((crc >> 15) | (crc << 17)) + 0xa282ead8`. The
//! data is an `Example` protobuf: a map from feature name to a list of
//! bytes, floats or int64s. `.index` companions (record offsets, for
//! random access) are not needed and are ignored.
//!
//! Of each record:
//!
//! - the **object** is the first of [`IMAGE_FEATURES`] the record has, as
//!   one bytes value. Its bytes are a contiguous range of the file (the
//!   protobuf is decoded over the record's buffer without copying, so the
//!   value's place in it is known): the object is read from there when it
//!   is written ([`Origin::Range`]), as a tar member is;
//! - the sample's key is its `key` / `image/filename` / `filename` feature
//!   when it has one, else `shard/index`;
//! - every other feature of one value is a metadata value
//!   ([`super::columns`]); a feature of several values is JSON text.
//!
//! A record whose data CRC does not match, or that is not an `Example`,
//! is that sample's error under the ingest's policy. A length whose CRC
//! does not match, or a file cut short, ends the shard (what follows
//! cannot be found), named at its byte.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use bytes::Bytes;
use prost::Message;

use super::Sample;
use super::columns::{SourceOf, Value, column_name};
use crate::ingest::MAX_OBJECT_BYTES;
use crate::ingest::entries::Origin;

/// Features that hold the object, in the order they are looked for.
pub const IMAGE_FEATURES: &[&str] = &[
    "image/encoded",
    "image",
    "image_raw",
    "image/raw",
    "jpg",
    "jpeg",
    "png",
    "webp",
    "data",
];

/// Features that name the sample, in the order they are looked for.
const KEY_FEATURES: &[&str] = &["key", "__key__", "image/filename", "filename"];

/// A record's CRC as TFRecord stores it.
pub fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[derive(Clone, PartialEq, Message)]
struct Example {
    #[prost(message, optional, tag = "1")]
    features: Option<Features>,
}

#[derive(Clone, PartialEq, Message)]
struct Features {
    #[prost(map = "string, message", tag = "1")]
    feature: HashMap<String, Feature>,
}

#[derive(Clone, PartialEq, Message)]
struct Feature {
    #[prost(oneof = "Kind", tags = "1, 2, 3")]
    kind: Option<Kind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Kind {
    #[prost(message, tag = "1")]
    Bytes(BytesList),
    #[prost(message, tag = "2")]
    Float(FloatList),
    #[prost(message, tag = "3")]
    Int64(Int64List),
}

#[derive(Clone, PartialEq, Message)]
struct BytesList {
    #[prost(bytes = "bytes", repeated, tag = "1")]
    value: Vec<Bytes>,
}

#[derive(Clone, PartialEq, Message)]
struct FloatList {
    #[prost(float, repeated, tag = "1")]
    value: Vec<f32>,
}

#[derive(Clone, PartialEq, Message)]
struct Int64List {
    #[prost(int64, repeated, tag = "1")]
    value: Vec<i64>,
}

/// How reading a record went.
enum Read1 {
    /// The file ended cleanly.
    End,
    /// A record's data (or why it is refused) and its length as its
    /// header says, which finds the next record either way.
    Record(u64, Result<Bytes, String>),
    /// The shard cannot be read on from here.
    Broken(u64, String),
}

/// Reads the record at `at`.
fn record(r: &mut impl Read, at: u64) -> Read1 {
    let mut head = [0u8; 12];
    match read_full(r, &mut head) {
        Ok(0) => return Read1::End,
        Ok(12) => {}
        Ok(n) => {
            return Read1::Broken(
                at,
                format!("truncated shard: {n} bytes of a record's header at byte {at}"),
            );
        }
        Err(e) => return Read1::Broken(at, format!("cannot read the shard at byte {at}: {e}")),
    }
    let len = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
    let len_crc = u32::from_le_bytes(head[8..].try_into().unwrap_or_default());
    if masked_crc(&head[..8]) != len_crc {
        return Read1::Broken(
            at,
            format!(
                "the record at byte {at}: its length's CRC does not match; the rest of the shard cannot be found"
            ),
        );
    }
    if len > MAX_OBJECT_BYTES {
        return Read1::Broken(
            at,
            format!("the record at byte {at} says it is {len} bytes, over {MAX_OBJECT_BYTES}"),
        );
    }
    let mut data = vec![0u8; len as usize + 4];
    match read_full(r, &mut data) {
        Ok(n) if n == data.len() => {}
        Ok(_) => {
            return Read1::Broken(
                at,
                format!("truncated shard: the record at byte {at} ({len} bytes) is cut short"),
            );
        }
        Err(e) => return Read1::Broken(at, format!("cannot read the shard at byte {at}: {e}")),
    }
    let crc = u32::from_le_bytes(data[len as usize..].try_into().unwrap_or_default());
    data.truncate(len as usize);
    if masked_crc(&data) != crc {
        return Read1::Record(
            len,
            Err(format!(
                "the record at byte {at}: its data's CRC does not match (a damaged record)"
            )),
        );
    }
    Read1::Record(len, Ok(Bytes::from(data)))
}

/// Fills `buf` unless the file ends first; how many bytes it got.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Appends the samples of the TFRecord `file` (`shard`: its name under
/// the source, `path`: where ingest reads it) to `out`.
pub(crate) fn samples(path: &Path, shard: &str, file: File, out: &mut Vec<Sample>) {
    samples_from(path, shard, BufReader::with_capacity(1 << 20, file), out);
}

/// [`samples`] of a shard read through `r` (a file's, or a stream from an
/// object store), sequentially.
pub(crate) fn samples_from(path: &Path, shard: &str, mut r: impl Read, out: &mut Vec<Sample>) {
    let (mut at, mut index) = (0u64, 0u64);
    loop {
        let source = SourceOf {
            shard: shard.to_owned(),
            index,
            offset: at,
        };
        match record(&mut r, at) {
            Read1::End => return,
            Read1::Broken(at, reason) => {
                out.push(Sample::refused(format!("{shard}@{at}"), reason, source));
                return;
            }
            Read1::Record(len, data) => {
                out.push(match data {
                    Ok(data) => example(path, shard, at + 12, data, source),
                    Err(reason) => Sample::refused(format!("{shard}/{index}"), reason, source),
                });
                at += 12 + len + 4;
                index += 1;
            }
        }
    }
}

/// The sample of one record's `data`, found at byte `at` of the file.
fn example(path: &Path, shard: &str, at: u64, data: Bytes, source: SourceOf) -> Sample {
    let fallback_key = format!("{shard}/{}", source.index);
    let features = match Example::decode(data.clone()) {
        Ok(e) => e.features.map(|f| f.feature).unwrap_or_default(),
        Err(e) => {
            return Sample::refused(fallback_key, format!("not a tf.train.Example: {e}"), source);
        }
    };
    let single_bytes = |name: &str| match features.get(name).and_then(|f| f.kind.as_ref()) {
        Some(Kind::Bytes(b)) if b.value.len() == 1 => Some(&b.value[0]),
        _ => None,
    };
    let key = KEY_FEATURES
        .iter()
        .find_map(|k| single_bytes(k).and_then(|v| std::str::from_utf8(v).ok()))
        .filter(|k| !k.is_empty())
        .map_or(fallback_key, str::to_owned);
    let Some((object_name, object)) = IMAGE_FEATURES
        .iter()
        .find_map(|n| single_bytes(n).map(|v| (*n, v)))
    else {
        let mut names: Vec<_> = features.keys().map(String::as_str).collect();
        names.sort_unstable();
        return Sample::refused(
            key,
            format!(
                "no image feature (looked for {}; the record has: {})",
                IMAGE_FEATURES.join(", "),
                names.join(", ")
            ),
            source,
        );
    };
    // The value shares the record's buffer: its place in it is where it is
    // in the file.
    let within = object.as_ptr() as usize - data.as_ptr() as usize;
    let origin = Origin::Range {
        path: path.to_owned(),
        offset: at + within as u64,
        len: object.len() as u64,
    };
    let mut names: Vec<&String> = features.keys().collect();
    names.sort_unstable();
    let mut values = Vec::new();
    for name in names {
        if name == object_name {
            continue;
        }
        if let Some(v) = features[name].kind.as_ref().and_then(value) {
            values.push((column_name(name), v));
        }
    }
    Sample {
        key,
        origin,
        values,
        source,
    }
}

/// A feature as one metadata value: its one value, or its values as JSON.
fn value(kind: &Kind) -> Option<Value> {
    match kind {
        Kind::Int64(l) if l.value.len() == 1 => Some(Value::Int(l.value[0])),
        Kind::Float(l) if l.value.len() == 1 => Some(Value::Float(f64::from(l.value[0]))),
        Kind::Bytes(l) if l.value.len() == 1 => Value::parse(&l.value[0], false).map(|v| match v {
            // Bytes are text: "3" stays the text it was written as.
            Value::Int(_) | Value::Float(_) => {
                Value::Text(String::from_utf8_lossy(&l.value[0]).into_owned())
            }
            v => v,
        }),
        Kind::Int64(l) => serde_json::to_string(&l.value).ok().map(Value::Json),
        Kind::Float(l) => serde_json::to_string(&l.value).ok().map(Value::Json),
        Kind::Bytes(l) => {
            let texts: Option<Vec<&str>> = l
                .value
                .iter()
                .map(|b| std::str::from_utf8(b).ok())
                .collect();
            texts
                .and_then(|t| serde_json::to_string(&t).ok())
                .map(Value::Json)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of `data` as TFRecord writes it.
    fn framed(data: &[u8]) -> Vec<u8> {
        let len = (data.len() as u64).to_le_bytes();
        let mut out = Vec::new();
        out.extend_from_slice(&len);
        out.extend_from_slice(&masked_crc(&len).to_le_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(&masked_crc(data).to_le_bytes());
        out
    }

    fn example_bytes(image: &[u8], label: i64, name: &str) -> Vec<u8> {
        let mut feature = HashMap::new();
        feature.insert(
            "image/encoded".to_owned(),
            Feature {
                kind: Some(Kind::Bytes(BytesList {
                    value: vec![Bytes::copy_from_slice(image)],
                })),
            },
        );
        feature.insert(
            "image/class/label".to_owned(),
            Feature {
                kind: Some(Kind::Int64(Int64List { value: vec![label] })),
            },
        );
        feature.insert(
            "image/filename".to_owned(),
            Feature {
                kind: Some(Kind::Bytes(BytesList {
                    value: vec![Bytes::copy_from_slice(name.as_bytes())],
                })),
            },
        );
        Example {
            features: Some(Features { feature }),
        }
        .encode_to_vec()
    }

    #[test]
    fn the_masked_crc_is_crc32c_rotated_and_offset() {
        // CRC-32C's check value, then TFRecord's mask of it.
        let crc: u32 = 0xe306_9283;
        assert_eq!(crc32c::crc32c(b"123456789"), crc);
        let masked = crc.rotate_right(15).wrapping_add(0xa282_ead8);
        assert_eq!(masked_crc(b"123456789"), masked);
    }

    #[test]
    fn an_objects_range_is_where_its_bytes_are_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tfrecord");
        let mut file = Vec::new();
        for i in 0..3u8 {
            file.extend(framed(&example_bytes(
                &[i; 100],
                i as i64,
                &format!("img{i}.jpg"),
            )));
        }
        std::fs::write(&path, &file).unwrap();
        let mut out = Vec::new();
        samples(&path, "s.tfrecord", File::open(&path).unwrap(), &mut out);
        assert_eq!(out.len(), 3);
        for (i, s) in out.iter().enumerate() {
            assert_eq!(s.key, format!("img{i}.jpg"));
            let Origin::Range { offset, len, .. } = s.origin else {
                panic!("{:?}", s.origin);
            };
            assert_eq!(
                &file[offset as usize..(offset + len) as usize],
                &[i as u8; 100]
            );
            assert_eq!(
                s.values,
                vec![("image_class_label".to_owned(), Value::Int(i as i64))]
                    .into_iter()
                    .chain([(
                        "image_filename".to_owned(),
                        Value::Text(format!("img{i}.jpg"))
                    )])
                    .collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_damaged_record_is_named_and_the_next_one_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tfrecord");
        let mut file = framed(&example_bytes(b"one", 1, "a.jpg"));
        let second = file.len();
        file.extend(framed(&example_bytes(b"two", 2, "b.jpg")));
        file.extend(framed(&example_bytes(b"three", 3, "c.jpg")));
        file[second + 14] ^= 0xff;
        std::fs::write(&path, &file).unwrap();
        let mut out = Vec::new();
        samples(&path, "s", File::open(&path).unwrap(), &mut out);
        let keys: Vec<_> = out.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["a.jpg", "s/1", "c.jpg"]);
        assert!(matches!(&out[1].origin, Origin::Refused(r) if r.contains("CRC does not match")));
        // A cut file: the last record is named, the others kept.
        std::fs::write(&path, &file[..file.len() - 5]).unwrap();
        let mut out = Vec::new();
        samples(&path, "s", File::open(&path).unwrap(), &mut out);
        assert!(
            matches!(&out[2].origin, Origin::Refused(r) if r.contains("truncated")),
            "{:?}",
            out[2]
        );
    }
}
