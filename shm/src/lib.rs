//! # sluice-shm: the shared-memory transport
//!
//! A trainer on the same host as its server reads a job's batches out of
//! `/dev/shm` instead of a socket: Flight carries only the control
//! messages (the handshake's types are the wire's,
//! `sluice_flight::shm_handshake`), and the batches' IPC messages are
//! written once, straight from their buffers, into a segment's slots.
//!
//! - [`segment`]: [`Segment`], a mapped file of fixed slots, and how the
//!   server writes a batch into one;
//! - [`kept`]: [`KeptSegments`], segments kept for a trainer between its
//!   streams, so an epoch does not pay for fresh pages;
//! - [`region`]: [`Region`], a flat mapped file for bulk bytes (a
//!   checkpoint's parts and reads on the same host);
//! - [`prepared`]: [`Prepared`], the granules of a region already
//!   reserved and faulted in;
//! - [`host`]: whether a trainer's probe shows it shares this host
//!   ([`host::verify`]), and [`host::sweep`] of what killed processes left.

pub mod host;
pub mod kept;
pub mod prepared;
pub mod region;
pub mod segment;

pub use kept::KeptSegments;
pub use prepared::Prepared;
pub use region::Region;
pub use segment::Segment;
