//! A DataFusion session whose tables are a store's datasets and whose
//! functions include sluice's UDFs.

use std::sync::Arc;

use datafusion::prelude::{SessionConfig, SessionContext};
use sluice_udfs::UdfEnv;

use crate::scan::{DatasetSchema, ScanOptions};
use crate::store::Store;

/// A session over `store` with default scan and UDF options.
pub fn session_context(store: Arc<Store>) -> SessionContext {
    session_context_with(
        store,
        ScanOptions::default(),
        &UdfEnv::new(Default::default()),
    )
}

/// A session over `store` whose default schema lists its datasets and whose
/// UDFs share `udfs` (policy, seed, epoch, limits, bad-sample log).
pub fn session_context_with(
    store: Arc<Store>,
    options: ScanOptions,
    udfs: &Arc<UdfEnv>,
) -> SessionContext {
    session_context_with_config(store, options, udfs, SessionConfig::new())
}

/// [`session_context_with`] under `config` (partitions, batch size).
pub fn session_context_with_config(
    store: Arc<Store>,
    options: ScanOptions,
    udfs: &Arc<UdfEnv>,
    config: SessionConfig,
) -> SessionContext {
    let config = config.with_information_schema(true);
    let ctx = SessionContext::new_with_config(config);
    let schema = Arc::new(DatasetSchema::new(store, options));
    if let Some(catalog) = ctx.catalog("datafusion") {
        // Replaces the empty default "public" schema.
        let _previous = catalog.register_schema("public", schema);
    }
    sluice_udfs::register(&ctx, udfs);
    ctx
}
