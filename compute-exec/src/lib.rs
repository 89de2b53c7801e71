//! # sluice-compute: the compute side
//!
//! ```text
//!  SQL ──► ComputeSession ──► planner (sluice-planner) ──► compute fragment
//!                │                                              │
//!                │ datasets, stats, cores (ListFlights, node_info)   │ FragmentTable
//!                ▼                                              ▼
//!        StorageEndpoint × N  ◄───── fragment ─────── RemoteFragmentExec (one partition a node)
//!        (Flight client, or the in-process storage node)
//! ```
//!
//! - [`session`]: [`ComputeSession`] — learns the storage nodes' datasets and
//!   statistics, plans a query, runs the compute fragment;
//! - [`compute_schema`] ([`ComputeSchema`](compute_schema::ComputeSchema)):
//!   the datasets the storage nodes listed as a session's tables;
//! - [`calibration`]: the planner's probes timed on the storage nodes, so
//!   auto placement and EXPLAIN use the dataset's own costs;
//! - [`remote`]: the tables the compute side plans over and
//!   [`RemoteFragmentExec`](remote::RemoteFragmentExec);
//! - [`on_node`]: one storage fragment run on the node holding its rows
//!   (in this process, or on the engine);
//! - [`plan_feeds`]: a job stream's feeds, one per storage node, each carrying
//!   every window of the stream to its node;
//! - [`explain`]: SQL `EXPLAIN` of a placed query;
//! - [`cooperative`]: joins yield between batches, so a query stops
//!   within a batch of its deadline or of its client leaving;
//! - [`offthread`]: a query planned and run on the query runtime, its
//!   batches handed to the service runtime, so REST, Flight control calls
//!   and `/healthz` never wait on query CPU;
//! - [`service`] and [`client`]: a compute node's Flight service (queries
//!   and job streams on one port), and its typed query client;
//! - [`queries`]: its SQL queries — who may run one, limits, deadline —
//!   run for `DoGet` and for Flight SQL alike;
//! - [`flight_sql`]: Flight SQL on the same port — statements, prepared
//!   statements, catalogs, schemas, tables, SQL info;
//! - [`descriptors`]: dataset descriptors `ListFlights` lists, followed by
//!   `GetFlightInfo`/`GetSchema` to a `DoGet` of the dataset's rows;
//! - [`checkpoints`]: a cluster's checkpoints, striped and replicated
//!   over its storage nodes, committed in two phases (the coordinator's
//!   ledger last);
//! - [`job`]: jobs — a pipeline delivered to the ranks of a trainer, epoch
//!   by epoch, shuffled, resumable;
//! - [`trainer`]: job streams to trainers (ticket, Flight info, batches
//!   with resume offsets), each through its sink: Flight messages, or
//!   shared-memory slots;
//! - [`direct`]: `DoGet` of job tickets answered in gRPC frames in front of
//!   tonic, so tensor bytes are not copied on their way out;
//! - [`access`]: what a caller may read through the compute side;
//! - [`engine`]: the cross-host data plane on the distributed engine;
//! - [`admission`]: whether a storage node that registers is read (its
//!   datasets against the ledger), the REST handler's logic;
//! - [`ingest`]: sharded ingest: one dataset version spread over every
//!   storage node, committed on all of them or on none;
//! - [`replicas`]: where each sample of a dataset spread over several
//!   storage nodes is, and who reads it (the ledger, `SampleIndex`, the key
//!   owners);
//! - [`error`]: `JobError` and `UnknownDataset`, each with its gRPC code
//!   and kind;
//! - [`moves`]: moving a replicated dataset's parts between storage nodes,
//!   online;
//! - [`repair`]: scrub and repair over a cluster: every storage node reads
//!   back its objects against their checksums;
//! - [`reported`]: `ReportedExec`: the receiving end of storage fragments
//!   that carry their report in band;
//! - [`sql_params`]: parameters of a prepared statement;
//! - [`statement_limits`]: `check_statement_size`: how big a SQL statement
//!   may be before it is planned.

pub mod access;
pub mod admission;
pub mod calibration;
pub mod checkpoints;
pub mod client;
pub mod compute_schema;
pub mod cooperative;
pub mod descriptors;
pub mod direct;
pub mod engine;
pub mod error;
pub mod explain;
pub mod flight_sql;
pub mod ingest;
pub mod job;
pub mod moves;
pub mod offthread;
pub mod on_node;
pub mod plan_feeds;
pub mod queries;
pub mod remote;
pub mod repair;
pub mod replicas;
pub mod reported;
pub mod service;
pub mod session;
pub mod sql_params;
pub mod statement_limits;
pub mod trainer;

pub use client::{QueryClient, QueryError, QueryResult};
pub use job::{Job, JobError, JobSpec, Jobs};
pub use service::QueryService;
pub use session::{ComputeSession, PlannedQuery, Prepared, ResourceHints, read_only};
pub use sluice_flight::ticket::{JobTicket, QueryTicket};
