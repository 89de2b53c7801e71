//! A node's link to its coordinator (`sluice serve`), over the
//! coordinator's REST API. Every [`REGISTER_EVERY`]:
//! - a compute node registers its Flight location (`POST
//!   /v1/nodes/compute`), so the coordinator sends it trainer ranks, and
//!   learns the storage nodes the coordinator reads (`GET /v1/nodes`);
//! - a storage node registers its location (`POST /v1/nodes/storage`), so
//!   the coordinator reads it and spreads ingests over it.
//!
//! A compute node finds the jobs it is asked for in the coordinator's
//! records (`GET /v1/jobs/{id}/record`, a [`JobSource`]).

use async_trait::async_trait;
use http::Method;
use sluice_compute::job::cluster::REGISTER_EVERY;
use sluice_compute::job::{JobRecord, JobSource};

use crate::rest_client::RestClient;

/// What a node does with the coordinator's `GET /v1/nodes` answer.
pub type NodesSeen = Box<dyn Fn(&serde_json::Value) + Send + Sync>;

/// The coordinator at a REST URL.
#[derive(Debug, Clone)]
pub struct Coordinator {
    url: String,
    client: RestClient,
}

impl Coordinator {
    /// The coordinator whose REST API is at `url`, asked with `token`.
    pub fn new(url: &str, token: Option<String>) -> anyhow::Result<Self> {
        Ok(Self {
            url: url.trim_end_matches('/').to_string(),
            client: RestClient::new(url, token)?,
        })
    }

    /// Registers `location` as a node of `role` (`compute` or `storage`)
    /// now and every [`REGISTER_EVERY`] until the process ends, then
    /// calls `after` with the coordinator's `GET /v1/nodes` answer when
    /// `after` is given; a coordinator that cannot be reached is retried
    /// (it may start after the node), and said once per outage.
    pub fn keep_registered(&self, role: &'static str, location: String, after: Option<NodesSeen>) {
        let client = self.client.clone();
        let url = self.url.clone();
        let path = format!("/v1/nodes/{role}");
        tokio::spawn(async move {
            let body = serde_json::json!({ "location": location });
            let mut down = false;
            loop {
                let said = client.call(Method::POST, &path, Some(&body)).await;
                let said = match (said, &after) {
                    (Ok(_), Some(after)) => client
                        .call(Method::GET, "/v1/nodes", None)
                        .await
                        .map(|v| after(&v)),
                    (r, _) => r.map(|_| ()),
                };
                match said {
                    Ok(()) if down => {
                        eprintln!("registered with the coordinator at {url} as {location}");
                        down = false;
                    }
                    Ok(()) => {}
                    Err(e) if !down => {
                        eprintln!("warning: cannot register with the coordinator at {url}: {e}");
                        down = true;
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(REGISTER_EVERY).await;
            }
        });
    }
}

/// The storage nodes a coordinator's `GET /v1/nodes` names that another
/// process can reach (an in-process node cannot be).
pub fn storage_urls(nodes: &serde_json::Value) -> Vec<String> {
    nodes["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n["name"].as_str())
                .filter(|n| n.starts_with("http://") || n.starts_with("https://"))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[async_trait]
impl JobSource for Coordinator {
    async fn record(&self, id: &str) -> Result<Option<JobRecord>, String> {
        let path = format!("/v1/jobs/{}/record", urlencode(id));
        match self.client.get_optional(&path).await {
            Ok(None) => Ok(None),
            Ok(Some(v)) => serde_json::from_value(v)
                .map(Some)
                .map_err(|e| format!("its record of job {id} is not one: {e}")),
            Err(e) => Err(e.to_string()),
        }
    }

    fn name(&self) -> &str {
        &self.url
    }
}

/// `id` as one path segment: job ids are letters, digits and `-`; any
/// other byte is percent-encoded.
fn urlencode(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
