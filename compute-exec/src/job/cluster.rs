//! Many compute nodes: which node serves each rank of a job, and how a
//! compute node comes to serve a job it was not given.
//!
//! - [`ComputeNodes`] is the coordinator's list of compute nodes that
//!   registered (each re-registers every [`REGISTER_EVERY`]; one silent
//!   for [`ComputeNodes::ttl`] is dropped). A trainer's ranks are served
//!   by the live nodes on its own host when there are any (found by the
//!   address it connects from); otherwise rank `r` is served by the
//!   `r mod n`-th live node in the order of their locations, or by the
//!   coordinator itself when none is live. A job's `GetFlightInfo`
//!   answers one endpoint per rank with that location (the Arrow Flight
//!   convention) and its REST status lists them; trainers follow them.
//! - A node that joins with a token of its own (a tokens file's, scope
//!   `node`) is bound to it: that token holds one compute location at a
//!   time (registering another moves it), no other token may take that
//!   location, and only that token may report progress for it. New
//!   locations are let in at a bounded rate ([`NEW_PER_SECOND`]) and up to
//!   [`MAX_COMPUTE_NODES`] at once: a flood of registrations is refused, not
//!   routed to.
//! - [`JobSource`] is where a compute node finds a job it does not hold:
//!   the coordinator's record of it (spec, pinned versions, created). The
//!   node plans the job again from the record over the same versions
//!   ([`super::Jobs::find`]): the order of every epoch follows from the
//!   spec and the samples, so every node delivers a rank the same bytes,
//!   and a trainer resuming at an offset on another node gets exactly the
//!   rest.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::store::JobRecord;

/// How often a compute node tells the coordinator it is alive.
pub const REGISTER_EVERY: Duration = Duration::from_secs(2);

/// Most compute nodes a coordinator holds at once.
pub const MAX_COMPUTE_NODES: usize = 4096;
/// New compute locations let in per second (and twice that at once).
pub const NEW_PER_SECOND: f64 = 20.0;

/// The compute nodes a coordinator knows, by their Flight location.
#[derive(Debug)]
pub struct ComputeNodes {
    seen: Mutex<Seen>,
    ttl: Duration,
}

#[derive(Debug)]
struct Seen {
    /// Location → when it last spoke.
    at: BTreeMap<String, Instant>,
    /// Location → the token that registered it, for tokens of their own.
    owners: BTreeMap<String, String>,
    /// Room for new locations (a token bucket).
    room: f64,
    filled: Instant,
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Another token holds that location.
    #[error("location {location} is registered by another node's token")]
    Taken {
        /// The location.
        location: String,
    },
    /// Too many new locations too fast, or too many nodes.
    #[error("{0}")]
    Busy(String),
}

impl Default for ComputeNodes {
    fn default() -> Self {
        Self::new(REGISTER_EVERY * 4)
    }
}

impl ComputeNodes {
    /// An empty list whose nodes are dropped after `ttl` without a word.
    pub fn new(ttl: Duration) -> Self {
        Self {
            seen: Mutex::new(Seen {
                at: BTreeMap::new(),
                owners: BTreeMap::new(),
                room: 2.0 * NEW_PER_SECOND,
                filled: Instant::now(),
            }),
            ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a node may stay silent.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Notes that the node at `location` (`grpc://host:port`) is alive,
    /// registered by the token named `owner` when that token is the
    /// node's own (see the module docs).
    pub fn register(&self, owner: Option<&str>, location: &str) -> Result<(), Refused> {
        let mut seen = self.lock();
        let ttl = self.ttl;
        seen.at.retain(|_, at| at.elapsed() <= ttl);
        if let Some(holder) = seen.owners.get(location)
            && owner != Some(holder.as_str())
        {
            return Err(Refused::Taken {
                location: location.to_string(),
            });
        }
        if !seen.at.contains_key(location) {
            if seen.at.len() >= MAX_COMPUTE_NODES {
                return Err(Refused::Busy(format!(
                    "{MAX_COMPUTE_NODES} compute nodes are registered already"
                )));
            }
            let now = Instant::now();
            let refill = (now - seen.filled).as_secs_f64() * NEW_PER_SECOND;
            seen.room = (seen.room + refill).min(2.0 * NEW_PER_SECOND);
            seen.filled = now;
            if seen.room < 1.0 {
                return Err(Refused::Busy(format!(
                    "new compute nodes register at most {NEW_PER_SECOND} a second: try again"
                )));
            }
            seen.room -= 1.0;
        }
        if let Some(owner) = owner {
            // A token holds one location: a node that moved leaves its old one.
            let old: Vec<String> = seen
                .owners
                .iter()
                .filter(|(l, o)| o.as_str() == owner && l.as_str() != location)
                .map(|(l, _)| l.clone())
                .collect();
            for l in old {
                seen.owners.remove(&l);
                seen.at.remove(&l);
            }
            seen.owners.insert(location.to_string(), owner.to_string());
        }
        seen.at.insert(location.to_string(), Instant::now());
        Ok(())
    }

    /// Whether the node at `location` registered within the time to live.
    pub fn is_live(&self, location: &str) -> bool {
        self.lock()
            .at
            .get(location)
            .is_some_and(|at| at.elapsed() <= self.ttl)
    }

    /// The token that registered `location`, when it was a node's own.
    pub fn owner_of(&self, location: &str) -> Option<String> {
        self.lock().owners.get(location).cloned()
    }

    /// Forgets the node at `location` (`sluice nodes remove`): whether it
    /// was known. A node that is still running registers again.
    pub fn remove(&self, location: &str) -> bool {
        let mut seen = self.lock();
        let owned = seen.owners.remove(location).is_some();
        seen.at.remove(location).is_some() || owned
    }

    /// The live nodes, by location, with the seconds since each spoke.
    pub fn live(&self) -> Vec<(String, f64)> {
        let mut seen = self.lock();
        let ttl = self.ttl;
        seen.at.retain(|_, at| at.elapsed() <= ttl);
        seen.at
            .iter()
            .map(|(l, at)| (l.clone(), at.elapsed().as_secs_f64()))
            .collect()
    }

    /// The node serving each of ranks `0..ranks` (`None`: no node is live),
    /// from one reading of the live nodes, for a trainer at `near`: the
    /// live nodes on that host serve its ranks, when there are any (a
    /// trainer reads from the node beside it, with no network hop);
    /// otherwise rank `r` goes to the `r mod n`-th of all of them.
    pub fn serving_ranks(&self, ranks: u64, near: Option<IpAddr>) -> Vec<Option<String>> {
        let live = self.live();
        let near = near.map(canonical);
        let beside: Vec<&String> = live
            .iter()
            .map(|(l, _)| l)
            .filter(|l| near.is_some() && location_ip(l) == near)
            .collect();
        let pool: Vec<&String> = if beside.is_empty() {
            live.iter().map(|(l, _)| l).collect()
        } else {
            beside
        };
        let n = pool.len() as u64;
        (0..ranks)
            .map(|r| (n > 0).then(|| pool[(r % n) as usize].clone()))
            .collect()
    }
}

/// The IP address of a location (`grpc://10.0.0.7:50052`,
/// `grpc://[::1]:7`); `None` for a host name (names are not resolved:
/// a node that should be found beside its trainers advertises an
/// address).
pub fn location_ip(location: &str) -> Option<IpAddr> {
    let rest = location.split_once("://").map_or(location, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.parse().ok().map(canonical)
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.7`, as a dual-stack
/// listener reports its IPv4 callers) as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Where a compute node finds the record of a job it does not hold.
#[async_trait]
pub trait JobSource: Send + Sync + std::fmt::Debug {
    /// The record of job `id`: `Ok(None)` if there is no such job, `Err`
    /// (saying why) if the source cannot be asked.
    async fn record(&self, id: &str) -> Result<Option<JobRecord>, String>;
    /// The source, as errors name it.
    fn name(&self) -> &str;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_spread_over_the_live_nodes_in_order() {
        let nodes = ComputeNodes::new(Duration::from_millis(200));
        assert_eq!(nodes.serving_ranks(1, None), [None]);
        nodes.register(None, "grpc://10.0.0.101:50053").unwrap();
        nodes.register(None, "grpc://10.0.0.100:50053").unwrap();
        let of: Vec<_> = nodes.serving_ranks(4, None).into_iter().flatten().collect();
        assert_eq!(
            of,
            [
                "grpc://10.0.0.100:50053",
                "grpc://10.0.0.101:50053",
                "grpc://10.0.0.100:50053",
                "grpc://10.0.0.101:50053"
            ]
        );
        // A node that stops speaking is dropped; its ranks move.
        std::thread::sleep(Duration::from_millis(250));
        nodes.register(None, "grpc://10.0.0.101:50053").unwrap();
        assert_eq!(nodes.live().len(), 1);
        assert_eq!(
            nodes.serving_ranks(1, None),
            [Some("grpc://10.0.0.101:50053".to_string())]
        );
    }

    #[test]
    fn a_node_s_own_token_holds_one_location_and_no_other_token_takes_it() {
        let nodes = ComputeNodes::new(Duration::from_secs(60));
        nodes.register(Some("c1"), "grpc://10.0.0.1:1").unwrap();
        assert_eq!(nodes.owner_of("grpc://10.0.0.1:1").as_deref(), Some("c1"));
        assert_eq!(
            nodes.register(Some("c2"), "grpc://10.0.0.1:1"),
            Err(Refused::Taken {
                location: "grpc://10.0.0.1:1".into()
            })
        );
        assert!(nodes.register(None, "grpc://10.0.0.1:1").is_err());
        // c1 moves: its old location is gone.
        nodes.register(Some("c1"), "grpc://10.0.0.1:2").unwrap();
        let live: Vec<String> = nodes.live().into_iter().map(|(l, _)| l).collect();
        assert_eq!(live, ["grpc://10.0.0.1:2"]);
        assert_eq!(nodes.owner_of("grpc://10.0.0.1:1"), None);
        assert!(nodes.remove("grpc://10.0.0.1:2"));
        assert!(!nodes.remove("grpc://10.0.0.1:2"));
        assert!(nodes.live().is_empty());
    }

    #[test]
    fn a_flood_of_new_locations_is_refused_and_heartbeats_are_not() {
        let nodes = ComputeNodes::new(Duration::from_secs(60));
        let mut taken = 0;
        for i in 0..10_000 {
            if nodes
                .register(None, &format!("grpc://10.1.{}.{}:1", i / 250, i % 250))
                .is_ok()
            {
                taken += 1;
            }
        }
        assert!(taken <= 2 * NEW_PER_SECOND as usize + 2, "{taken} let in");
        // Those let in keep registering.
        for (l, _) in nodes.live() {
            nodes.register(None, &l).unwrap();
        }
    }

    #[test]
    fn a_trainer_beside_a_node_reads_from_it() {
        let nodes = ComputeNodes::new(Duration::from_secs(60));
        for l in [
            "grpc://10.0.0.100:50053",
            "grpc://10.0.0.101:50053",
            "grpc://10.0.0.101:50054",
        ] {
            nodes.register(None, l).unwrap();
        }
        let near = |ip: &str| Some(ip.parse().unwrap());
        // On host .100: every rank from the node there.
        let got = nodes.serving_ranks(3, near("10.0.0.100"));
        assert!(
            got.iter()
                .all(|l| l.as_deref() == Some("grpc://10.0.0.100:50053"))
        );
        // On host .101 (two nodes): its ranks spread over those two.
        let got: Vec<_> = nodes
            .serving_ranks(4, near("::ffff:10.0.0.101"))
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(
            got,
            [
                "grpc://10.0.0.101:50053",
                "grpc://10.0.0.101:50054",
                "grpc://10.0.0.101:50053",
                "grpc://10.0.0.101:50054"
            ]
        );
        // Elsewhere: all three nodes, in order.
        let got: Vec<_> = nodes
            .serving_ranks(3, near("10.0.0.9"))
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], "grpc://10.0.0.100:50053");
        assert_eq!(location_ip("grpc://[::1]:7"), near("::1"));
        assert_eq!(location_ip("grpc://node-3:7"), None);
    }
}
