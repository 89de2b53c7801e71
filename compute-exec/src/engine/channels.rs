//! [`NodeChannels`]: how the coordinating session reaches the storage
//! nodes' engine workers — the same URL, TLS and token as the node's
//! Flight client, one channel per node for the session's life.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion_distributed::grpc::{BoxCloneSyncChannel, create_worker_client};
use datafusion_distributed::{ChannelResolver, WorkerChannel};
use http::HeaderValue;
use sluice_flight::{Credential, StorageEndpoint};
use tower::ServiceExt;
use url::Url;

/// See the module docs.
#[derive(Clone, Default)]
pub struct NodeChannels {
    credentials: Arc<HashMap<String, Credential>>,
    open: Arc<Mutex<HashMap<String, BoxCloneSyncChannel>>>,
}

impl std::fmt::Debug for NodeChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeChannels")
            .field("nodes", &self.credentials.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl NodeChannels {
    /// The channels to `endpoints` (those reached over the network).
    pub fn new(endpoints: &[Arc<dyn StorageEndpoint>]) -> Self {
        let credentials = endpoints
            .iter()
            .filter_map(|e| Some((e.name().to_string(), e.credential()?.clone())))
            .collect();
        Self {
            credentials: Arc::new(credentials),
            open: Arc::default(),
        }
    }

    fn channel(&self, url: &Url) -> Result<BoxCloneSyncChannel, DataFusionError> {
        let key = url.as_str().trim_end_matches('/');
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = open.get(key) {
            return Ok(c.clone());
        }
        let Some(credential) = self.credentials.get(key) else {
            return Err(DataFusionError::Plan(format!(
                "{key} is not a storage node of this session"
            )));
        };
        let (_, endpoint) =
            sluice_flight::stream::dial(key, credential).map_err(DataFusionError::Plan)?;
        let bearer = match credential.bearer_value() {
            Some(v) => Some(
                HeaderValue::from_bytes(v.as_encoded_bytes())
                    .map_err(|e| DataFusionError::Plan(e.to_string()))?,
            ),
            None => None,
        };
        let channel =
            endpoint
                .connect_lazy()
                .map_request(move |mut r: http::Request<tonic::body::Body>| {
                    if let Some(v) = &bearer {
                        r.headers_mut()
                            .insert(http::header::AUTHORIZATION, v.clone());
                    }
                    r
                });
        let channel = BoxCloneSyncChannel::new(channel);
        open.insert(key.to_string(), channel.clone());
        Ok(channel)
    }
}

#[async_trait]
impl ChannelResolver for NodeChannels {
    async fn get_worker_client_for_url(
        &self,
        url: &Url,
    ) -> Result<Box<dyn WorkerChannel>, DataFusionError> {
        self.channel(url).map(create_worker_client)
    }
}
