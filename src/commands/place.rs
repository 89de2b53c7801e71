//! The compute session a command plans and runs queries with: over remote
//! storage nodes (`--storage`), or over an in-process storage node serving
//! the data dir.

use std::sync::Arc;

use sluice_base::Executor;
use sluice_compute::{ComputeSession, ResourceHints};
use sluice_flight::{Credential, StorageClient, StorageEndpoint, Tls};
use sluice_storage::StorageNode;
use sluice_udfs::cost::{PROFILES_FILE, Profiles, load_profiles};

use super::{open_store, scan_options};
use crate::cli::{Cli, PlaceFlags, RateArg};
use crate::rest_client::RestClient;

/// Resource hints from flags.
pub fn hints(
    storage_cores: Option<usize>,
    compute_cores: Option<usize>,
    link: Option<RateArg>,
) -> ResourceHints {
    ResourceHints {
        storage_cores: storage_cores.map(|c| c as f64),
        compute_cores: compute_cores.map(|c| c as f64),
        link_bytes_per_s: link.and_then(|r| r.0),
    }
}

/// The UDF profiles in force: the data dir's calibration, else the defaults.
pub fn profiles(cli: &Cli) -> anyhow::Result<Profiles> {
    load_profiles(&cli.data_dir.join(PROFILES_FILE)).map_err(anyhow::Error::msg)
}

/// An in-process storage node over the data dir, on an executor of its
/// own of `cores` threads (default: one per core).
pub fn local_node(
    cli: &Cli,
    cores: Option<usize>,
    link_limit: Option<RateArg>,
) -> anyhow::Result<Arc<StorageNode>> {
    Ok(StorageNode::new(
        open_store(cli)?,
        scan_options(cli),
        cores.unwrap_or_else(sluice_planner::resources::machine_cores),
        link_limit.and_then(|r| r.0),
    )?)
}

/// An in-process storage node over the data dir whose fragments run on
/// `executor`.
pub fn local_node_on(
    cli: &Cli,
    executor: Arc<Executor>,
    link_limit: Option<RateArg>,
) -> anyhow::Result<Arc<StorageNode>> {
    Ok(StorageNode::on(
        executor,
        open_store(cli)?,
        scan_options(cli),
        link_limit.and_then(|r| r.0),
    ))
}

/// Clients of remote storage nodes.
pub fn remote_nodes(cli: &Cli, urls: &[String]) -> anyhow::Result<Vec<Arc<dyn StorageEndpoint>>> {
    let credential = node_credential(cli)?;
    urls.iter()
        .map(|u| {
            Ok(
                Arc::new(StorageClient::with_credential(u, credential.clone())?)
                    as Arc<dyn StorageEndpoint>,
            )
        })
        .collect()
}

/// The token this process presents to other nodes (`--node-token`, else
/// the first `--token`).
pub fn node_token(cli: &Cli) -> Option<String> {
    cli.node_token
        .clone()
        .or_else(|| cli.token.first().cloned())
}

/// [`node_token`] and [`tls`] as a Flight client's credential.
pub fn node_credential(cli: &Cli) -> anyhow::Result<Credential> {
    Ok(Credential::bearer(node_token(cli).as_deref())
        .map_err(anyhow::Error::msg)?
        .with_tls(tls(cli)?))
}

/// A client of the REST API at `url` presenting `token`, over TLS when
/// `url` is `https://`.
pub fn rest_client(cli: &Cli, url: &str, token: Option<String>) -> anyhow::Result<RestClient> {
    RestClient::new(url, token, tls(cli)?)
}

/// The TLS the flags give (`--tls-ca`, `--tls-cert`, `--tls-key`).
pub fn tls(cli: &Cli) -> anyhow::Result<Option<Arc<Tls>>> {
    Ok(Tls::load(
        cli.tls_ca.as_deref(),
        cli.tls_cert.as_deref(),
        cli.tls_key.as_deref(),
    )
    .map_err(anyhow::Error::msg)?
    .map(Arc::new))
}

/// The compute session the flags describe.
pub fn session(cli: &Cli, place: &PlaceFlags) -> anyhow::Result<ComputeSession> {
    let endpoints: Vec<Arc<dyn StorageEndpoint>> = if place.storage.is_empty() {
        vec![local_node(cli, place.storage_cores, place.link_limit)?]
    } else {
        remote_nodes(cli, &place.storage)?
    };
    let storage_cores = if place.storage.is_empty() {
        None
    } else {
        place.storage_cores
    };
    Ok(ComputeSession::new(
        endpoints,
        profiles(cli)?,
        hints(storage_cores, place.compute_cores, place.link_bandwidth),
    )
    .with_calibration(calibration(place.no_calibrate)))
}

/// Calibration as the flags ask: on (the defaults) unless `--no-calibrate`.
pub fn calibration(off: bool) -> Option<sluice_planner::CalibrationOptions> {
    (!off).then(sluice_planner::CalibrationOptions::default)
}
