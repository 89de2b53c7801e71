//! The messages of the link.
//!
//! - A Flight **ticket** is a [`Ticket`] (protobuf): either a fragment to
//!   run — its datafusion-proto bytes and the job's UDF options — or a
//!   probe asking for a number of bytes, which the compute side times to
//!   measure the link. A `DoGet` takes those two; a `DoExchange` opens a
//!   **feed** ([`crate::feed`]): its first message's descriptor command is
//!   a [`Ticket`] holding the fragment ([`TicketKind::Feed`]), and every
//!   later message's app metadata a [`WindowTicket`], the rows of one
//!   window of a job.
//! - `ListFlights` answers one `FlightInfo` per dataset: its name and
//!   latest version as the descriptor path, its schema, sample and byte
//!   counts, and its
//!   [`DatasetStats`](sluice_planner::DatasetStats) as JSON app metadata.
//! - The `node_info` action answers [`NodeInfo`](crate::NodeInfo) as JSON.
//! - The `time_fragment` action ([`TimeTicket`]) runs a fragment on the
//!   node without sending its rows and answers its
//!   [`FragmentTiming`](crate::FragmentTiming) as JSON (calibration).
//! - A fragment's stream ends with a message whose app metadata is a
//!   [`FragmentReport`] (JSON): the bad samples the node met.

/// A Flight ticket.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ticket {
    /// What is asked for.
    #[prost(oneof = "TicketKind", tags = "1, 2, 3")]
    pub kind: Option<TicketKind>,
}

/// The kinds of ticket.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum TicketKind {
    /// Run a fragment.
    #[prost(message, tag = "1")]
    Fragment(FragmentTicket),
    /// Send bytes to time the link.
    #[prost(message, tag = "2")]
    Probe(ProbeTicket),
    /// Bind a fragment once and run it for every window that follows
    /// (the first message of a `DoExchange` only).
    #[prost(message, tag = "3")]
    Feed(FragmentTicket),
}

/// The rows of one window of a job, sent down a feed: a
/// [`Take`](crate::Take) of the fragment's scans.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WindowTicket {
    /// The dataset version the job pinned.
    #[prost(uint64, tag = "1")]
    pub version: u64,
    /// Row ids of the version's metadata, in the order wanted.
    #[prost(uint32, repeated, tag = "2")]
    pub rows: Vec<u32>,
    /// The slot of each row.
    #[prost(uint32, repeated, tag = "3")]
    pub slots: Vec<u32>,
}

/// A fragment to run.
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
