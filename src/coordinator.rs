//! A node's link to its coordinator (`sluice serve`), over the
//! coordinator's REST API. Every [`REGISTER_EVERY`]:
//! - a compute node registers its Flight location (`POST
//!   /v1/nodes/compute`), so the coordinator sends it trainer ranks, and
//!   learns from the answer the storage nodes the coordinator reads;
//! - a storage node registers its location (`POST /v1/nodes/storage`), so
//!   the coordinator reads it and spreads ingests over it.
//!
//! A compute node finds the jobs it is asked for in the coordinator's
//! records (`GET /v1/jobs/{id}/record`, a [`JobSource`]) and reports what
//! it delivered for them (`POST /v1/jobs/{id}/progress`, every
//! [`REPORT_EVERY`]).

use async_trait::async_trait;
use http::Method;
use std::collections::HashMap;
use std::sync::Arc;

use sluice_compute::Jobs;
use sluice_compute::job::cluster::REGISTER_EVERY;
use sluice_compute::job::report::{REPORT_EVERY, Reported};
use sluice_compute::job::{JobRecord, JobSource};

use crate::rest_client::RestClient;

/// Reports, every [`REPORT_EVERY`], what this compute node delivered for
/// each job it serves (`sluice_compute::job::report`) as `node`, until the
/// process ends. A report the coordinator did not take is folded into the
/// next; a job the coordinator no longer knows is no longer reported.
pub fn report_progress(coordinator: Coordinator, jobs: Arc<Jobs>, node: String) {
    sluice_base::task::detach(async move {
        let mut said: HashMap<String, Reported> = HashMap::new();
        loop {
            tokio::time::sleep(REPORT_EVERY).await;
            let held: Vec<_> = jobs.list();
            said.retain(|id, _| held.iter().any(|j| j.id() == id));
            for job in held {
                let last = said.get(job.id()).copied().unwrap_or_default();
                let Some((report, now)) = job.report_since(&node, &last) else {
                    continue;
                };
                let path = format!("/v1/jobs/{}/progress", urlencode(job.id()));
                let Ok(body) = serde_json::to_value(&report) else {
                    continue;
                };
                match coordinator
                    .client
                    .call(Method::POST, &path, Some(&body))
                    .await
                {
                    Ok(_) => {
                        said.insert(job.id().to_string(), now);
                    }
                    Err(e) => tracing::debug!("progress of job {}: {e}", job.id()),
                }
            }
        }
    });
}

/// What a node does with the coordinator's answer to its registration.
pub type NodesSeen = Box<dyn Fn(&serde_json::Value) + Send + Sync>;

/// The coordinator at a REST URL.
#[derive(Debug, Clone)]
pub struct Coordinator {
    url: String,
    client: RestClient,
}

impl Coordinator {
    /// The coordinator whose REST API is at `url`, asked with `client`.
    pub fn new(url: &str, client: RestClient) -> Self {
        Self {
            url: url.trim_end_matches('/').to_string(),
            client,
        }
    }

    /// Registers `location` as a node of `role` (`compute` or `storage`)
    /// once: the coordinator's answer.
    pub async fn register_once(
        &self,
        role: &str,
        location: &str,
    ) -> anyhow::Result<serde_json::Value> {
        let body = serde_json::json!({ "location": location });
        self.client
            .call(Method::POST, &format!("/v1/nodes/{role}"), Some(&body))
            .await
    }

    /// Registers `location` as a node of `role` (`compute` or `storage`)
    /// now and every [`REGISTER_EVERY`] until the process ends, handing
    /// each answer to `after` when given; a coordinator that cannot be
    /// reached is retried (it may start after the node), and said once per
    /// outage.
    pub fn keep_registered(&self, role: &'static str, location: String, after: Option<NodesSeen>) {
        let client = self.client.clone();
        let url = self.url.clone();
        let path = format!("/v1/nodes/{role}");
        sluice_base::task::detach(async move {
            let body = serde_json::json!({ "location": location });
            let mut down = false;
            loop {
                let said = client.call(Method::POST, &path, Some(&body)).await.map(
                    |reply: serde_json::Value| {
                        if let Some(after) = &after {
                            after(&reply);
                        }
                    },
                );
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

/// The storage nodes a coordinator's answer to a compute node's
/// registration names (`storage`: those other processes can reach).
pub fn storage_urls(reply: &serde_json::Value) -> Vec<String> {
    reply["storage"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str())
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
/// `id` as one URL path segment.
pub fn urlencode(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
