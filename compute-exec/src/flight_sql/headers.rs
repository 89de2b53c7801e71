//! The options a pipeline query needs, as Flight SQL request headers
//! (ADBC sets them with `adbc.flight.sql.rpc.call_header.<name>`):
//! `x-sluice-seed`, `x-sluice-epoch`, `x-sluice-on-error` (`fail`,
//! `null`, `skip`) and `x-sluice-offload` (`auto`, `storage`, `compute`,
//! a cut).

use sluice_planner::Offload;
use sluice_udfs::{Limits, OnError, UdfOptions};
use tonic::Status;
use tonic::metadata::MetadataMap;

use super::invalid;

/// The offload and UDF options `headers` give, under the server's
/// `limits`; a header that is not text or not a valid value is refused,
/// naming it.
pub fn options(headers: &MetadataMap, limits: &Limits) -> Result<(Offload, UdfOptions), Status> {
    let header = |name: &str| -> Result<Option<String>, Status> {
        headers
            .get(name)
            .map(|v| {
                v.to_str()
                    .map(str::to_owned)
                    .map_err(|_| invalid(format!("header {name} is not text")))
            })
            .transpose()
    };
    let number = |name: &str| -> Result<Option<u64>, Status> {
        header(name)?
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| invalid(format!("header {name}: {v:?} is not a whole number")))
            })
            .transpose()
    };
    let on_error = match header("x-sluice-on-error")? {
        Some(v) => v
            .parse::<OnError>()
            .map_err(|e| invalid(format!("header x-sluice-on-error: {e}")))?,
        None => OnError::default(),
    };
    let offload = match header("x-sluice-offload")? {
        Some(v) => v
            .parse::<Offload>()
            .map_err(|e| invalid(format!("header x-sluice-offload: {e}")))?,
        None => Offload::default(),
    };
    let udf = UdfOptions {
        on_error,
        seed: number("x-sluice-seed")?.unwrap_or(0),
        epoch: number("x-sluice-epoch")?.unwrap_or(0),
        limits: *limits,
        cache_stages: false,
    };
    Ok((offload, udf))
}
