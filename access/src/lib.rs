//! Who may do what in sluice.
//!
//! ```text
//!  authorization: Bearer TOKEN ──► Auth::authenticate ──► Principal (an Arc<Grant>)
//!        (REST, Flight, Flight SQL's Basic login)              │
//!                                                              ▼
//!     route / call / dataset / checkpoint ──► Grant::may_* ──► allowed, or refused
//!                                                              │ and written to the
//!                                                              ▼ audit log (who, what, when)
//! ```
//!
//! - A **token** is a random secret. The server keeps only its BLAKE3
//!   hash, in a tokens file ([`TokenFile`], YAML) that it reads again on
//!   SIGHUP. `sluice tokens add` makes one and prints the secret once.
//! - Each token carries a [`Grant`]: its name (who the audit log says
//!   called), its [`Scope`]s (`read`, `ingest`, `admin`, `node`), the
//!   dataset names it may touch (glob patterns) and the checkpoint name
//!   prefixes it may read and write.
//! - `node` is not a user's scope: it is the identity a storage or compute
//!   node joins the cluster with. A node's registration, its progress
//!   reports and the coordinator's calls to storage nodes need it, and a
//!   user's token never has it unless the operator wrote it there;
//! - [`audit`]: `Audit`: the record of every refusal: who, what, when, from
//!   where;
//! - [`auth`]: `Auth`: the bearer check of every REST route and Flight call;
//! - [`grant`]: `Grant`: what one token allows;
//! - [`pass`]: `PassGate`, `UploadPass`: a trainer's pass to write its
//!   stripes of one cluster checkpoint upload on a storage node;
//! - [`read_pass`]: `ReadPasses`, `ReadPass`: a node's signed pass to read
//!   one version of a piece there (a presigned GET);
//! - [`tokens`]: `TokenFile`: the tokens a server accepts, as its operator
//!   writes them.
//! - With no token configured at all, the server is open: every caller is
//!   [`Grant::everyone`] (a development server on loopback).
//! - Tokens given on the command line (`--token`) carry every scope, as
//!   they always did: one secret for a small setup. A cluster with users
//!   uses a tokens file.
//!
//! This crate knows nothing of datasets, jobs or routes: the services ask
//! it questions about names.

pub mod audit;
pub mod auth;
pub mod grant;
pub mod pass;
pub mod read_pass;
pub mod tokens;

pub use audit::Audit;
pub use auth::{AUTHORIZATION, Auth};
pub use grant::{Grant, Principal, Scope};
pub use pass::{PASS_HEADER, PassGate, PassHash, UploadPass};
pub use read_pass::{READ_PASS_HEADER, ReadPass, ReadPasses};
pub use tokens::TokenFile;
