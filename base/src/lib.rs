//! # sluice-base: what every sluice crate may use
//!
//! The bottom of the house, below the wire and the engines, so that a
//! crate can say what went wrong and where work runs without pulling in
//! the Flight protocol:
//!
//! - [`fault`]: [`Fault`], the one error vocabulary (a gRPC code and a
//!   stable kind per error) and the one mapping to `tonic::Status`;
//!   [`error_details`]: the kind as a `google.rpc.ErrorInfo` in the
//!   status details; [`call_error`]: [`CallError`], what a service
//!   answers when a call itself is wrong;
//! - [`bad_sample`]: [`BadSample`], a sample a stage refused, by name;
//!   [`on_error`]: [`OnError`], what a stage does with it;
//! - [`executor`]: [`Executor`], the named pool of threads a process
//!   computes on, shared by the roles it plays; [`task`]: how work is
//!   spawned, each task owned (or not) as its kind of work needs;
//! - [`cpu_time`]: the process's CPU time, as nodes report it.

pub mod bad_sample;
pub mod call_error;
pub mod cpu_time;
pub mod error_details;
pub mod executor;
pub mod fault;
pub mod on_error;
pub mod task;

pub use bad_sample::BadSample;
pub use call_error::CallError;
pub use cpu_time::process_cpu_ns;
pub use executor::Executor;
pub use fault::Fault;
pub use on_error::OnError;
