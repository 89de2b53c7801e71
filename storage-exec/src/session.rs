//! A DataFusion session whose tables are a store's datasets.

use std::sync::Arc;

use datafusion::prelude::{SessionConfig, SessionContext};

use crate::scan::{DatasetSchema, ScanOptions};
use crate::store::Store;

/// A session over `store` with default scan options.
pub fn session_context(store: Arc<Store>) -> SessionContext {
    session_context_with(store, ScanOptions::default())
}

/// A session over `store` whose default schema lists its datasets.
pub fn session_context_with(store: Arc<Store>, options: ScanOptions) -> SessionContext {
    let config = SessionConfig::new().with_information_schema(true);
    let ctx = SessionContext::new_with_config(config);
    let schema = Arc::new(DatasetSchema::new(store, options));
    if let Some(catalog) = ctx.catalog("datafusion") {
        // Replaces the empty default "public" schema.
        let _previous = catalog.register_schema("public", schema);
    }
    ctx
}
