//! [`NodeChannels`]: how the coordinating session reaches the storage
//! nodes' engine workers — over the connection this process already holds
//! to each node for Flight (the same URL and TLS identity), presenting the
//! same bearer token. A query or a job stream opens no connection of its
//! own.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion_distributed::grpc::{BoxCloneSyncChannel, create_worker_client};
use datafusion_distributed::{ChannelResolver, WorkerChannel};
use http::HeaderValue;
use sluice_flight::StorageEndpoint;
use tower::ServiceExt;
use url::Url;

/// See the module docs.
#[derive(Clone, Default)]
pub struct NodeChannels {
    nodes: Arc<HashMap<String, BoxCloneSyncChannel>>,
}

impl std::fmt::Debug for NodeChannels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeChannels")
            .field("nodes", &self.nodes.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl NodeChannels {
    /// The channels to `endpoints` (those reached over the network).
    pub fn new(endpoints: &[Arc<dyn StorageEndpoint>]) -> Self {
        let nodes = endpoints
            .iter()
            .filter_map(|e| {
                let (channel, credential) = (e.channel()?, e.credential()?);
                // A token is visible ASCII (`Credential::bearer`): a valid
                // header value.
                let bearer = credential
                    .bearer_value()
                    .and_then(|v| HeaderValue::from_bytes(v.as_encoded_bytes()).ok());
                let channel =
                    channel.map_request(move |mut r: http::Request<tonic::body::Body>| {
                        if let Some(v) = &bearer {
                            r.headers_mut()
                                .insert(http::header::AUTHORIZATION, v.clone());
                        }
                        r
                    });
                Some((e.name().to_string(), BoxCloneSyncChannel::new(channel)))
            })
            .collect();
        Self {
            nodes: Arc::new(nodes),
        }
    }
}

#[async_trait]
impl ChannelResolver for NodeChannels {
    async fn get_worker_client_for_url(
        &self,
        url: &Url,
    ) -> Result<Box<dyn WorkerChannel>, DataFusionError> {
        let key = url.as_str().trim_end_matches('/');
        match self.nodes.get(key) {
            Some(channel) => Ok(create_worker_client(channel.clone())),
            None => Err(DataFusionError::Plan(format!(
                "{key} is not a storage node of this session"
            ))),
        }
    }
}
