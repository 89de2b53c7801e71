//! What a trainer and its server say to set up shared memory
//! (`crate::shm`): the [`Transport`] a trainer asks for, the [`Probe`]
//! that proves it shares this host's `/dev/shm`, where the stream's
//! segment is ([`SegmentInfo`]) and which slot holds a batch
//! ([`SlotRef`]); and [`sweep`], which removes what processes killed
//! before they could clean up left in `/dev/shm`.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Where segments and probes live.
pub const SHM_DIR: &str = "/dev/shm";
/// Prefix of a trainer's probe file.
pub const PROBE_PREFIX: &str = "sluice-probe-";
/// Prefix of a segment file.
pub const SEGMENT_PREFIX: &str = "sluice-seg-";

/// How a trainer asks for shared memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Shared memory when the probe shows the same host, else Flight.
    #[default]
    Auto,
    /// Shared memory or an error that says why not.
    Shm,
    /// Flight only.
    Flight,
}

/// A trainer's proof that it shares this host's `/dev/shm`: the name of a
/// file it made there and the nonce it wrote in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    /// File name under [`SHM_DIR`], starting with [`PROBE_PREFIX`].
    pub name: String,
    /// What the file holds.
    pub nonce: String,
}

impl Probe {
    /// Whether the file exists here and holds the nonce; `Err` says why
    /// not, naming the file.
    pub fn verify(&self) -> Result<(), String> {
        let valid = self.name.starts_with(PROBE_PREFIX)
            && self.name.len() <= 128
            && self.name[PROBE_PREFIX.len()..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !valid || self.nonce.is_empty() || self.nonce.len() > 64 {
            return Err(format!("probe {:?} is not a sluice probe", self.name));
        }
        let path = Path::new(SHM_DIR).join(&self.name);
        let mut held = Vec::with_capacity(64);
        File::open(&path)
            .and_then(|f| f.take(65).read_to_end(&mut held))
            .map_err(|e| {
                format!(
                    "the trainer's probe {} is not on this host ({e})",
                    path.display()
                )
            })?;
        if held != self.nonce.as_bytes() {
            return Err(format!(
                "the trainer's probe {} holds another nonce: another host's {SHM_DIR}",
                path.display()
            ));
        }
        Ok(())
    }
}

/// Where a segment is, as the stream's first control message says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    /// Its path.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Slots.
    pub slots: u64,
    /// Bytes per slot.
    pub slot_bytes: u64,
}

/// One slot's batch, as its app metadata names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRef {
    /// The slot.
    pub slot: u64,
    /// Bytes of the IPC message in it.
    pub len: u64,
}

/// Removes segment files whose server process is gone (killed before it
/// could unlink them), and probes whose trainer process is gone (killed
/// between making one and its server's answer).
pub fn sweep() {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| {
            n.strip_prefix(SEGMENT_PREFIX)
                .or_else(|| n.strip_prefix(PROBE_PREFIX))
        }) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(c) = CString::new(format!("/proc/{pid}")) else {
            continue;
        };
        // SAFETY: `c` is a valid NUL-terminated path; access only stats it.
        let alive = unsafe { libc::access(c.as_ptr(), libc::F_OK) } == 0;
        if !alive {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
