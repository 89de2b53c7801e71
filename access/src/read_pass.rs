//! Read passes: how a trainer reads its stripes of a cluster checkpoint
//! straight from the storage nodes, which take only nodes' calls.
//!
//! ```text
//!  trainer ── checkpoint.stat {name, direct: true} ──► coordinator
//!  coordinator ── checkpoint.read_pass {name: piece, version} ──► each storage node holding a piece
//!               ◄── {pass: "<expiry>.<BLAKE3 keyed MAC of piece, version, expiry>"}
//!  trainer ◄── {…, direct: {unit, pieces: [{url, piece, version, stripes, pass}, …]}}
//!  trainer ── DoGet {checkpoint: piece, version, offset, length}, x-sluice-read-pass ──► storage node
//!               PassGate: a DoGet carrying a read pass skips the node-token check, marked ReadPass;
//!               the node serves it only as a range of that very version, before the expiry
//! ```
//!
//! A read pass is a presigned GET, as S3's are: a MAC under a key that
//! only the node holds (32 random bytes drawn when it starts) over what
//! may be read and until when. The node keeps nothing per pass, so
//! passes cost no memory however many a coordinator asks for, and none
//! outlives the node process that signed it (a restarted node answers
//! `forbidden`, and the trainer's reader goes through the coordinator).
//! A pass reads one version of one piece, any range of it, for
//! [`READ_PASS_TTL`]; no other version, name or call. It travels only in
//! the coordinator's answer to the trainer that asked (over that
//! trainer's own link) and in that trainer's `DoGet`s, and is never
//! logged.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The header a read pass travels in.
pub const READ_PASS_HEADER: &str = "x-sluice-read-pass";

/// How long a read pass reads.
pub const READ_PASS_TTL: Duration = Duration::from_secs(15 * 60);

/// A read pass as a call presented it: set by [`crate::PassGate`] in the
/// request's extensions of a `DoGet` it let through without a token, and
/// checked against the ticket by the service.
#[derive(Debug, Clone)]
pub struct ReadPass(pub String);

/// A node's key for the read passes it signs (see the module docs).
pub struct ReadPasses {
    key: [u8; 32],
}

impl std::fmt::Debug for ReadPasses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadPasses(…)")
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

impl ReadPasses {
    /// A fresh key; `None` where the OS gives no randomness (a guessable
    /// key is worse than none: reads then go through the coordinator).
    pub fn new() -> Option<Self> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).ok()?;
        Some(Self { key })
    }

    /// The MAC of `name`'s version `version` readable until `expires`
    /// (seconds since the Unix epoch).
    fn mac(&self, name: &str, version: u64, expires: u64) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&version.to_le_bytes());
        h.update(&expires.to_le_bytes());
        h.finalize()
    }

    /// A pass that reads version `version` of `name` for
    /// [`READ_PASS_TTL`].
    pub fn issue(&self, name: &str, version: u64) -> String {
        self.issue_until(name, version, now_secs() + READ_PASS_TTL.as_secs())
    }

    fn issue_until(&self, name: &str, version: u64, expires: u64) -> String {
        format!("{expires}.{}", self.mac(name, version, expires).to_hex())
    }

    /// Whether `pass` reads version `version` of `name` now (its MAC
    /// compared in constant time, as `blake3::Hash`'s equality is).
    pub fn admits(&self, pass: &ReadPass, name: &str, version: u64) -> bool {
        let Some((expires, mac)) = pass.0.split_once('.') else {
            return false;
        };
        let (Ok(expires), Ok(mac)) = (expires.parse::<u64>(), blake3::Hash::from_hex(mac)) else {
            return false;
        };
        expires >= now_secs() && self.mac(name, version, expires) == mac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_pass_reads_its_own_version_only_until_it_expires() {
        let keys = ReadPasses::new().unwrap();
        let pass = ReadPass(keys.issue(".stripes/u/a", 3));
        assert!(keys.admits(&pass, ".stripes/u/a", 3));
        assert!(!keys.admits(&pass, ".stripes/u/a", 4));
        assert!(!keys.admits(&pass, ".stripes/u/b", 3));
        // Another node's key signs other passes.
        assert!(!ReadPasses::new().unwrap().admits(&pass, ".stripes/u/a", 3));
        // Expired, or its expiry moved on.
        let old = ReadPass(keys.issue_until("a", 1, now_secs() - 1));
        assert!(!keys.admits(&old, "a", 1));
        let (_, mac) = old.0.split_once('.').unwrap();
        let moved = ReadPass(format!("{}.{mac}", now_secs() + 60));
        assert!(!keys.admits(&moved, "a", 1));
        for junk in ["", ".", "1.", "x.y", "99999999999.00"] {
            assert!(!keys.admits(&ReadPass(junk.into()), "a", 1), "{junk:?}");
        }
    }

    #[test]
    fn names_that_run_into_the_version_do_not_share_a_pass() {
        let keys = ReadPasses::new().unwrap();
        let pass = ReadPass(keys.issue("a1", 2));
        assert!(!keys.admits(&pass, "a", 12));
    }
}
