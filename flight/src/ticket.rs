//! [`Ticket`]: every `DoGet` ticket a sluice compute node takes, as one
//! tagged enum — JSON `{"type": "job" | "query" | "checkpoint", …}`.
//!
//! What a ticket is comes from its tag, never from guessing which fields
//! it has; a ticket without a known tag is refused with an error that
//! names the tags. (Flight SQL's tickets are protobuf `Any` messages, told
//! apart by their type URL before this parser is asked; a storage node's
//! fragment tickets are protobuf too, see [`crate::messages`].)

use serde::{Deserialize, Serialize};
use sluice_planner::Offload;
use sluice_udfs::UdfOptions;
use tonic::Status;

use crate::checkpoint::GetTicket;
use crate::shm_handshake::Held;
use crate::shm_handshake::{Probe, Transport};

/// See the module docs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Ticket {
    /// A rank's read of a job's epoch: the trainer's stream.
    Job(JobTicket),
    /// A SQL statement's rows.
    Query(QueryTicket),
    /// A byte range of a checkpoint version.
    Checkpoint(GetTicket),
}

impl Ticket {
    /// The ticket in `bytes`, or `INVALID_ARGUMENT` saying what a ticket is.
    pub fn parse(bytes: &[u8]) -> Result<Self, Status> {
        serde_json::from_slice(bytes).map_err(|e| {
            sluice_base::fault::status_with(
                tonic::Code::InvalidArgument,
                "bad_ticket",
                &format!(
                    "a ticket is JSON with a \"type\" of \"job\", \"query\" or \"checkpoint\" \
                     (or a Flight SQL command): {e}"
                ),
            )
        })
    }

    /// Its bytes, as a `DoGet` takes them.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Plain structs of strings, numbers and enums always serialize.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A rank's read of an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobTicket {
    /// The job id.
    pub job: String,
    /// The rank, below the job's world size.
    #[serde(default)]
    pub rank: u64,
    /// The epoch, below the job's epochs.
    #[serde(default)]
    pub epoch: u64,
    /// The position in the rank's share of the epoch to start at.
    #[serde(default)]
    pub offset: u64,
    /// At most this many positions (none: to the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// The DataLoader worker reading, below `workers`: it reads the
    /// rank's batches `worker`, `worker + workers`, …, and `offset` and
    /// `limit` are positions in that part.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub worker: u64,
    /// The rank's DataLoader workers (1: the whole share).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub workers: u64,
    /// How the batches travel (default `auto`: shared memory when `probe`
    /// shows the trainer is on this host).
    #[serde(default, skip_serializing_if = "is_auto")]
    pub transport: Transport,
    /// The trainer's proof that it shares this host's `/dev/shm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
    /// The segments the trainer still maps from its earlier streams: one
    /// of them may carry this stream too (see `sluice_shm::kept`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn one() -> u64 {
    1
}

fn is_one(v: &u64) -> bool {
    *v == 1
}

fn is_auto(t: &Transport) -> bool {
    *t == Transport::Auto
}

/// A SQL statement, where its stages may run, and its UDF options (the
/// server caps their limits by its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryTicket {
    /// The SQL.
    pub sql: String,
    /// Where its stages may run.
    #[serde(default)]
    pub offload: Offload,
    /// Its UDF options.
    #[serde(default)]
    pub udf: UdfOptions,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_read_by_its_tag() {
        let job = Ticket::parse(br#"{"type": "job", "job": "j-1", "rank": 1}"#).unwrap();
        assert!(matches!(job, Ticket::Job(JobTicket { ref job, rank: 1, .. }) if job == "j-1"));
        let q = Ticket::parse(br#"{"type": "query", "sql": "SELECT 1"}"#).unwrap();
        assert!(matches!(q, Ticket::Query(QueryTicket { ref sql, .. }) if sql == "SELECT 1"));
        let c = Ticket::parse(
            br#"{"type": "checkpoint", "checkpoint": "m.pt", "version": 2, "length": 9}"#,
        )
        .unwrap();
        assert!(matches!(
            c,
            Ticket::Checkpoint(GetTicket { version: 2, .. })
        ));
        for t in [job, q, c] {
            assert_eq!(Ticket::parse(&t.to_bytes()).unwrap(), t);
        }
    }

    #[test]
    fn an_untagged_or_odd_ticket_is_refused_naming_the_tags() {
        for bad in [
            &br#"{"job": "j-1"}"#[..],
            br#"{"sql": "SELECT 1"}"#,
            br#"{"type": "frobnicate"}"#,
            br#"{"type": "job", "job": "j-1", "rnak": 1}"#,
            b"j-1",
            b"",
        ] {
            let e = Ticket::parse(bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with("bad_ticket: "), "{}", e.message());
            assert!(e.message().contains("\"checkpoint\""), "{}", e.message());
        }
    }
}
