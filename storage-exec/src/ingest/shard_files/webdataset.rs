//! WebDataset shards: tar files whose members are grouped into samples by
//! key (`000123.jpg`, `000123.cls`, `000123.json` are one sample).
//!
//! A member's key is its path up to the first `.` of its file name, and
//! its extension the rest (`a/000123.seg.png` → key `a/000123`, extension
//! `seg.png`); the members of one key are one sample, adjacent or not
//! (`tar` without `--sort=name` scatters them), in the order the keys
//! first come. A member whose extension its key's sample has already
//! begins another sample of that key: a key twice, which ingest refuses
//! by name, keeping the first. Of a sample's members:
//!
//! - the **object** is the first whose extension is a format sluice reads
//!   (an image, a video, an array: [`OBJECT_EXTENSIONS`]); it is not read
//!   here: the sample's bytes are the member's range of the shard, read in
//!   place when the object is written ([`Origin::Range`]); the sample's
//!   key is the object member's path, as an ImageFolder ingest of the
//!   unpacked files would key it;
//! - every other member of at most [`MAX_VALUE_BYTES`] that is UTF-8 is a
//!   metadata value ([`super::columns`]): `cls` as the column `label`
//!   (ImageFolder's name for it), `json` kept as JSON text, the rest by
//!   extension; other members (binary, or larger) are left out, and said
//!   once per shard in the log.
//!
//! What breaks a sample is that sample's error under the ingest's policy,
//! never the shard's: a sample without an object member, a key twice
//! in the shard. What breaks the shard (a corrupt header, a shard cut
//! short) is named at the byte where it happens, and the shard's samples
//! before it are kept. Headers are read with the `tar` crate (ustar, GNU
//! and PAX long names), in one sequential pass of 1 MiB reads; object
//! bytes are passed over, not kept (each is read again, with one pread,
//! when it is written: from the page cache the pass just filled).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use super::Sample;
use super::columns::{SourceOf, Value, column_name};
use crate::ingest::entries::Origin;

/// Extensions of the objects a sample carries (the last part of a
/// member's extension, any case).
pub const OBJECT_EXTENSIONS: &[&str] = &[
    "jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm", "pnm", "avif",
    "ico", "tga", "qoi", "exr", "hdr", "mp4", "webm", "mkv", "avi", "mov", "npy", "npz",
];

/// Bytes of each read of a shard at enumeration.
const READ_BYTES: usize = 1 << 20;

/// Largest member read as a metadata value.
pub const MAX_VALUE_BYTES: u64 = 1 << 20;

/// One member of the sample being grouped.
struct Member {
    name: String,
    extension: String,
    offset: u64,
    len: u64,
    /// Its bytes, for a value member.
    value: Option<Vec<u8>>,
}

/// The members of one key.
struct Group {
    key: String,
    header: u64,
    members: Vec<Member>,
}

/// The samples of one shard as its members come: the members of the
/// current key, and how many samples were made.
struct Grouping<'a> {
    path: &'a Path,
    shard: &'a str,
    /// The samples so far, in the order their keys first came.
    groups: Vec<Group>,
    /// Each key's latest sample.
    latest: HashMap<String, usize>,
    left_out: BTreeSet<String>,
}

impl Grouping<'_> {
    /// Adds a member of `key` to the key's sample, or begins another one
    /// when that sample has a member of this extension already.
    fn add(&mut self, key: &str, header: u64, member: Member) {
        let open = self.latest.get(key).copied().filter(|&i| {
            !self.groups[i]
                .members
                .iter()
                .any(|m| m.extension.eq_ignore_ascii_case(&member.extension))
        });
        let i = open.unwrap_or_else(|| {
            self.groups.push(Group {
                key: key.to_owned(),
                header,
                members: Vec::new(),
            });
            self.latest.insert(key.to_owned(), self.groups.len() - 1);
            self.groups.len() - 1
        });
        self.groups[i].members.push(member);
    }

    /// Ends the shard: its samples, then `last` if the shard broke.
    fn end(self, out: &mut Vec<Sample>, last: Option<Sample>) {
        let mut left_out = self.left_out;
        for (index, g) in self.groups.into_iter().enumerate() {
            out.push(sample(
                self.path,
                self.shard,
                index as u64,
                g,
                &mut left_out,
            ));
        }
        out.extend(last);
        if !left_out.is_empty() {
            tracing::warn!(
                "shard {}: members left out (binary, over {MAX_VALUE_BYTES} bytes, or a \
                 second object): {}",
                self.shard,
                left_out.into_iter().collect::<Vec<_>>().join(", ")
            );
        }
    }

    /// Where a sample that begins now, at `offset`, comes from.
    fn source(&self, offset: u64) -> SourceOf {
        SourceOf {
            shard: self.shard.to_owned(),
            index: self.groups.len() as u64,
            offset,
        }
    }
}

/// Appends the samples of the tar `file` (`shard`: its name under the
/// source, `path`: where ingest reads it) to `out`.
pub(crate) fn samples(path: &Path, shard: &str, file: File, out: &mut Vec<Sample>) {
    let size = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => return out.push(broken(shard, 0, format!("cannot read the shard: {e}"))),
    };
    // Read through in large sequential reads (objects passed over, not
    // kept): a few system calls per MiB where a seek past each member
    // costs two per member, and the pass leaves the shard in the page
    // cache for the objects' preads.
    samples_from(
        path,
        shard,
        BufReader::with_capacity(READ_BYTES, file),
        size,
        out,
    );
}

/// [`samples`] of a tar of `size` bytes read through `reader` (a file's,
/// or a stream from an object store), sequentially.
pub(crate) fn samples_from(
    path: &Path,
    shard: &str,
    reader: impl Read,
    size: u64,
    out: &mut Vec<Sample>,
) {
    let mut grouping = Grouping {
        path,
        shard,
        groups: Vec::new(),
        latest: HashMap::new(),
        left_out: BTreeSet::new(),
    };
    let mut archive = tar::Archive::new(reader);
    let entries = match archive.entries() {
        Ok(e) => e,
        Err(e) => return out.push(broken(shard, 0, format!("not a tar file: {e}"))),
    };
    let mut at = 0u64;
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => {
                let why = format!(
                    "corrupt tar header after byte {at} ({e}); the rest of the shard is not read"
                );
                return grouping.end(out, Some(broken(shard, at, why)));
            }
        };
        let header = entry.raw_header_position();
        let (offset, len) = (entry.raw_file_position(), entry.size());
        at = offset.saturating_add(len);
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = match entry.path() {
            Ok(p) => crate::ingest::entries::key_part(p.as_os_str()),
            Err(e) => {
                let why = format!("a member's name is unreadable: {e}");
                out.push(broken(shard, header, why));
                continue;
            }
        };
        let name = name.trim_start_matches("./").to_owned();
        let Some((key, extension)) = split(&name) else {
            continue;
        };
        if at > size {
            let why =
                format!("truncated shard: this member ends at byte {at}, the shard at byte {size}");
            let source = grouping.source(header);
            return grouping.end(out, Some(Sample::refused(name.clone(), why, source)));
        }
        let member = Member {
            name: name.clone(),
            extension: extension.to_owned(),
            offset,
            len,
            value: value_of(&mut entry, extension, len),
        };
        grouping.add(key, header, member);
    }
    grouping.end(out, None);
}

/// A value member's bytes (`None` for an object, or one too large).
fn value_of(member: &mut impl Read, extension: &str, len: u64) -> Option<Vec<u8>> {
    if is_object(extension) || len > MAX_VALUE_BYTES {
        return None;
    }
    let mut v = Vec::with_capacity(len as usize);
    member.take(len).read_to_end(&mut v).ok().map(|_| v)
}

/// A member's key and extension; `None` for a name with no extension or
/// a hidden file.
fn split(name: &str) -> Option<(&str, &str)> {
    let base_at = name.rfind('/').map_or(0, |i| i + 1);
    let base = &name[base_at..];
    if base.starts_with('.') {
        return None;
    }
    let dot = base.find('.')?;
    Some((&name[..base_at + dot], &base[dot + 1..]))
}

/// Whether a member with `extension` is an object.
fn is_object(extension: &str) -> bool {
    let last = extension.rsplit('.').next().unwrap_or(extension);
    OBJECT_EXTENSIONS
        .iter()
        .any(|e| e.eq_ignore_ascii_case(last))
}

/// The sample `group` makes.
fn sample(
    path: &Path,
    shard: &str,
    index: u64,
    group: Group,
    left_out: &mut BTreeSet<String>,
) -> Sample {
    let source = SourceOf {
        shard: shard.to_owned(),
        index,
        offset: group.header,
    };
    let object = group
        .members
        .iter()
        .position(|m| is_object(&m.extension) && !m.extension.contains('.'))
        .or_else(|| group.members.iter().position(|m| is_object(&m.extension)));
    let Some(object) = object else {
        let names: Vec<_> = group.members.iter().map(|m| m.name.as_str()).collect();
        return Sample::refused(
            group.key.clone(),
            format!(
                "sample {} has no image or other object member (members: {})",
                group.key,
                names.join(", ")
            ),
            source,
        );
    };
    let mut values = Vec::new();
    for (i, m) in group.members.iter().enumerate() {
        if i == object {
            continue;
        }
        let name = match m.extension.as_str() {
            "cls" => "label".to_owned(),
            e => column_name(e),
        };
        match m
            .value
            .as_deref()
            .and_then(|v| Value::parse(v, m.extension == "json"))
        {
            Some(v) => values.push((name, v)),
            None => {
                left_out.insert(format!("*.{}", m.extension));
            }
        }
    }
    let m = &group.members[object];
    Sample {
        key: m.name.clone(),
        origin: Origin::Range {
            path: path.to_owned(),
            offset: m.offset,
            len: m.len,
        },
        values,
        source,
    }
}

/// What stops a shard being read, at byte `at`.
fn broken(shard: &str, at: u64, reason: String) -> Sample {
    Sample::refused(
        format!("{shard}@{at}"),
        reason,
        SourceOf {
            shard: shard.to_owned(),
            index: 0,
            offset: at,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_end_at_the_first_dot_of_the_file_name() {
        assert_eq!(split("000123.jpg"), Some(("000123", "jpg")));
        assert_eq!(split("a.b/000123.seg.png"), Some(("a.b/000123", "seg.png")));
        assert_eq!(split("dir/.hidden.txt"), None);
        assert_eq!(split("README"), None);
        assert!(is_object("JPG") && is_object("seg.png") && !is_object("cls"));
    }

    /// A tar of `members` (name, bytes), in that order.
    fn shard(dir: &Path, members: &[(&str, &[u8])]) -> std::path::PathBuf {
        let path = dir.join("s.tar");
        let mut b = tar::Builder::new(File::create(&path).unwrap());
        for (name, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.finish().unwrap();
        path
    }

    #[test]
    fn scattered_members_are_grouped_and_a_key_twice_is_two_samples() {
        let dir = tempfile::tempdir().unwrap();
        // As `tar` without --sort writes them: members of a key apart.
        let path = shard(
            dir.path(),
            &[
                ("a.jpg", b"A"),
                ("b.jpg", b"B"),
                ("a.cls", b"1"),
                ("b.cls", b"2"),
                ("a.jpg", b"again"),
            ],
        );
        let mut out = Vec::new();
        samples(&path, "s.tar", File::open(&path).unwrap(), &mut out);
        let keys: Vec<_> = out.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["a.jpg", "b.jpg", "a.jpg"]);
        assert_eq!(out[0].values, [("label".to_owned(), Value::Int(1))]);
        assert_eq!(out[1].values, [("label".to_owned(), Value::Int(2))]);
        assert!(out[2].values.is_empty());
        let indexes: Vec<_> = out.iter().map(|s| s.source.index).collect();
        assert_eq!(indexes, [0, 1, 2]);
    }
}
