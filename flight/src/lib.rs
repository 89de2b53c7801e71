//! # sluice-flight: the wire
//!
//! What sluice's nodes and trainers say to each other over Arrow Flight,
//! and how it is laid out on the wire. The error vocabulary and the
//! executor are below it (`sluice-base`), the shared-memory transport
//! above it (`sluice-shm`).
//!
//! - [`messages`]: a storage node's tickets (a link probe) and actions
//!   (a fragment timed for calibration), and the per-dataset and per-node
//!   descriptions it lists;
//! - the storage fragment itself (its scan leaf, take, report and codec)
//!   is the planner's (`sluice_planner::fragment`), defined once for the
//!   embedded default and the engine alike;
//! - [`endpoint`]: [`StorageEndpoint`], what the compute side needs of a
//!   storage node, implemented over Flight by [`StorageClient`] and
//!   in-process by the storage crate (which alone runs fragments without
//!   the engine, [`InProcessNode`]); [`ingest`]: the parts of a sharded
//!   ingest as they travel;
//! - [`feed`]: [`Feed`], a fragment bound once on a storage node and run
//!   for every window of a job stream;
//! - [`error`]: [`LinkError`] and its mapping to and from `tonic::Status`;
//! - [`stream`]: the message stream both kinds of node send, and `connect`;
//!   [`link`]: a dialled node, retried alike everywhere;
//! - [`credential`]: [`Credential`], what a node presents on the calls it
//!   makes (its token, and its certificate); [`tls`]: [`Tls`], the
//!   cluster's CA and a node's certificate as tonic's and rustls's
//!   configurations;
//! - [`slices`] and [`frames`]: Flight messages whose IPC body is the
//!   batch's own buffers, and their gRPC frames written without copying
//!   them (the trainer streams); [`gather`]: the same for rows picked
//!   from other batches, never made into a batch of their own, laid out
//!   by [`body`]; [`piece`]: a stretch of such a body, which may be
//!   computed where it is written; [`finish`]: a column so computed, the
//!   job's last elementwise stage run as its rows are written out;
//! - [`shm_handshake`]: what a trainer and its server say to set up
//!   shared memory;
//! - [`ticket`]: [`Ticket`], every `DoGet` ticket of a compute node as one
//!   tagged enum (job, query, checkpoint);
//! - [`checkpoint`]: the checkpoint protocol trainers speak to the same
//!   service, and [`CheckpointEndpoint`], the service's side of it (the
//!   store that serves it is the storage crate's `checkpoint`);
//! - [`lru`]: [`Lru`], a map under a byte budget, scan-resistant: the
//!   eviction policy of the node's caches (defined in `sluice_udfs`, whose
//!   stage cache uses it too, and re-exported here);
//! - [`throttle`]: a token bucket to limit the link (an experiment knob);
//! - [`client`]: `StorageClient`: a storage node over Arrow Flight;
//! - [`copy`]: moving replicas between storage nodes, as it travels between
//!   the coordinator and a node;
//! - [`scrub`]: scrub and repair of a storage node's objects, as they travel
//!   between the coordinator and a node.

pub mod body;
pub mod checkpoint;
pub mod client;
pub mod copy;
pub mod credential;
pub mod endpoint;
pub mod error;
pub mod feed;
pub mod finish;
pub mod frames;
pub mod gather;
pub mod ingest;
pub mod link;
pub mod messages;
pub mod piece;
pub mod scrub;
pub mod shm_handshake;
pub mod slices;
pub mod stream;
pub mod throttle;
pub mod ticket;
pub mod tls;

pub use checkpoint::CheckpointEndpoint;
pub use client::StorageClient;
pub use credential::{Credential, FlightClient};
pub use endpoint::{FragmentTiming, InProcessNode, NodeInfo, RemoteDataset, StorageEndpoint};
pub use error::LinkError;
pub use feed::Feed;
pub use sluice_udfs::lru::{self, Lru};
pub use throttle::TokenBucket;
pub use ticket::Ticket;
pub use tls::{ClientCerts, Tls};

/// Largest Flight message body the storage side sends; batches are sliced
/// to stay under it (tonic refuses messages over 4 MiB by default).
pub const MAX_FLIGHT_DATA: usize = 2 << 20;
/// Largest message a client accepts.
pub const MAX_MESSAGE: usize = 64 << 20;
