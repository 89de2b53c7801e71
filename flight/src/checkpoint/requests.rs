//! The bodies of the checkpoint actions that every server of the
//! protocol reads alike (a store on one machine, a cluster's
//! coordinator), how they are read, and what a name may be.

use bytes::Bytes;
use serde::Deserialize;
use sluice_base::CallError;
use tonic::Status;

/// Longest checkpoint name, in bytes.
pub const MAX_NAME: usize = 512;

/// Why `name` is not a checkpoint name (`None`: it is one): `/`-separated
/// segments of letters, digits, `.`, `_`, `-` and `=`, none empty, `.` or
/// `..`, at most [`MAX_NAME`] bytes in all.
pub fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("it is empty");
    }
    if name.len() > MAX_NAME {
        return Some("it is longer than 512 bytes");
    }
    for seg in name.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Some("segments between '/' must not be empty, '.' or '..'");
        }
        if !seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'='))
        {
            return Some("use letters, digits, '.', '_', '-', '=' and '/' between segments");
        }
    }
    None
}

/// The most uploads one group may hold (`checkpoint.begin_group`).
pub const MAX_GROUP: usize = 4096;

/// Why uploads of `names` cannot be begun or committed as one group
/// (`None`: they can): a group holds one upload or more, at most
/// [`MAX_GROUP`], each of its own name.
pub fn group_problem<S: AsRef<str>>(names: &[S]) -> Option<String> {
    if names.len() > MAX_GROUP {
        return Some(format!(
            "a group of {} uploads; at most {MAX_GROUP}",
            names.len()
        ));
    }
    let mut sorted: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    sorted.sort_unstable();
    if sorted.is_empty() {
        return Some("a group of no uploads".into());
    }
    sorted
        .windows(2)
        .find(|w| w[0] == w[1])
        .map(|w| format!("two uploads of '{}' in one group", w[0]))
}

/// `checkpoint.stat`, `checkpoint.delete`, `checkpoint.read_pass`: a
/// name, and a version or none.
#[derive(Debug, Deserialize)]
pub struct Named {
    /// The checkpoint.
    pub name: String,
    /// One version (none: the newest, or every one).
    #[serde(default)]
    pub version: Option<u64>,
}

/// `checkpoint.stat` to a coordinator: the version [`Named`], and whether
/// the reader would read the stripes from the storage nodes itself (the
/// answer then adds [`crate::checkpoint::DirectRead`] where the nodes give
/// read passes). One machine reads it as [`Named`].
#[derive(Debug, Deserialize)]
pub struct Stat {
    /// The version.
    #[serde(flatten)]
    pub named: Named,
    /// See the type's docs.
    #[serde(default)]
    pub direct: bool,
}

/// `checkpoint.begin`.
#[derive(Debug, Deserialize)]
pub struct Begin {
    /// The checkpoint a version is written of.
    pub name: String,
    /// Asked of a storage node by its coordinator: an upload pass too,
    /// for the trainer to write its stripes there itself
    /// (`sluice_access::pass`; a node that gives none answers without).
    #[serde(default)]
    pub pass: bool,
    /// Asked of a coordinator by a trainer: the stripes' layout and each
    /// node's upload and pass, to write the stripes to the storage nodes
    /// directly ([`crate::checkpoint::Direct`]; none where a node gave
    /// no pass).
    #[serde(default)]
    pub direct: bool,
}

/// `checkpoint.begin_group`: uploads of several names begun in one
/// request (a checkpoint's files, to commit together with
/// `checkpoint.commit_group`).
#[derive(Debug, Deserialize)]
pub struct BeginGroup {
    /// The checkpoints a version is written of, each once.
    pub names: Vec<String>,
    /// As [`Begin::direct`], for each upload.
    #[serde(default)]
    pub direct: bool,
}

/// `checkpoint.open_uploads`: which of these uploads are still open (a
/// coordinator asks of the nodes a trainer writes to directly, since it
/// sees none of their parts).
#[derive(Debug, Deserialize)]
pub struct Uploads {
    /// The uploads asked about.
    pub uploads: Vec<String>,
}

/// `checkpoint.commit`, and each upload of a group.
#[derive(Debug, Deserialize)]
pub struct Commit {
    /// The upload.
    pub upload: String,
    /// Its size: its parts cover `[0, size)` exactly once.
    pub size: u64,
}

/// `checkpoint.abort`.
#[derive(Debug, Deserialize)]
pub struct UploadId {
    /// The upload.
    pub upload: String,
}

/// `checkpoint.commit_group`.
#[derive(Debug, Deserialize)]
pub struct Group {
    /// The uploads, committed together.
    pub uploads: Vec<Commit>,
}

impl Group {
    /// Its uploads as (id, size).
    pub fn pairs(self) -> Vec<(String, u64)> {
        self.uploads
            .into_iter()
            .map(|c| (c.upload, c.size))
            .collect()
    }
}

/// `checkpoint.list`.
#[derive(Debug, Deserialize)]
pub struct Prefix {
    /// Names starting with this (default: every one).
    #[serde(default)]
    pub prefix: String,
}

/// Action `kind`'s body, or `INVALID_ARGUMENT` saying what is wrong.
pub fn body<'a, T: Deserialize<'a>>(kind: &str, bytes: &'a [u8]) -> Result<T, Status> {
    serde_json::from_slice(bytes).map_err(|e| CallError::bad_request(format!("{kind}: {e}")))
}

/// An answer as JSON bytes.
pub fn json_bytes(v: &impl serde::Serialize) -> Result<Bytes, Status> {
    serde_json::to_vec(v)
        .map(Bytes::from)
        .map_err(|e| CallError::encoding(e.to_string()))
}

/// The error of an action no server of the protocol knows.
pub fn unknown(kind: &str) -> Status {
    CallError::bad_request(format!(
        "unknown checkpoint action {:?}",
        kind.chars().take(64).collect::<String>()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_one_upload_or_more_of_distinct_names() {
        assert_eq!(group_problem(&["a", "b"]), None);
        assert!(group_problem::<&str>(&[]).is_some());
        assert!(group_problem(&["b", "a", "b"]).is_some());
    }

    #[test]
    fn names_are_paths_of_plain_segments() {
        for ok in [
            "run7/epoch3/rank0.pt",
            "a",
            "x=1/y_2-z.bin",
            ".stripes/0a/run/x",
        ] {
            assert_eq!(name_problem(ok), None, "{ok}");
        }
        for bad in ["", "/a", "a//b", "a/../b", "a b", "é", &"x".repeat(513)] {
            assert!(name_problem(bad).is_some(), "{bad}");
        }
    }
}
