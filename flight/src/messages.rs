//! The messages of the link.
//!
//! - A Flight **ticket** is a [`Ticket`] (protobuf): a probe asking for a
//!   number of bytes, which the compute side times to measure the link.
//!   Storage fragments do not cross on Flight: they run as tasks of the
//!   distributed engine's worker, served beside this service on the same
//!   port (the compute crate's `engine` module).
//! - `ListFlights` answers one `FlightInfo` per dataset: its name and
//!   latest version as the descriptor path, its schema, sample and byte
//!   counts, and its
//!   [`DatasetStats`](sluice_planner::DatasetStats) as JSON app metadata.
//! - The `node_info` action answers [`NodeInfo`](crate::NodeInfo) as JSON.
//! - The `time_fragment` action ([`TimeTicket`]) runs a fragment on the
//!   node without sending its rows and answers its
//!   [`FragmentTiming`](crate::FragmentTiming) as JSON (calibration).

/// A Flight ticket.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ticket {
    /// What is asked for.
    #[prost(oneof = "TicketKind", tags = "2")]
    pub kind: Option<TicketKind>,
}

/// The kinds of ticket. Tags 1 and 3 were a fragment and a feed, which
/// now run on the engine's worker; a node answers them as unknown.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum TicketKind {
    /// Send bytes to time the link.
    #[prost(message, tag = "2")]
    Probe(ProbeTicket),
}

/// A fragment to time ([`TimeTicket`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FragmentTicket {
    /// The physical plan, datafusion-proto encoded.
    #[prost(bytes = "vec", tag = "1")]
    pub plan: Vec<u8>,
    /// The job's UDF options as JSON (policy, limits).
    #[prost(string, tag = "2")]
    pub udf_options: String,
}

/// A link probe.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeTicket {
    /// Bytes to send.
    #[prost(uint64, tag = "1")]
    pub bytes: u64,
}

/// The action answering [`NodeInfo`](crate::NodeInfo).
pub const NODE_INFO: &str = "node_info";

/// The action that runs a fragment without sending its rows and answers
/// [`FragmentTiming`](crate::FragmentTiming) as JSON: calibration.
pub const TIME_FRAGMENT: &str = "time_fragment";

/// The body of [`TIME_FRAGMENT`]: a fragment and how long it may run.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeTicket {
    /// The fragment.
    #[prost(message, optional, tag = "1")]
    pub fragment: Option<FragmentTicket>,
    /// Milliseconds it may run; past them, the rows done so far count.
    #[prost(uint64, tag = "2")]
    pub budget_ms: u64,
}
