//! [`ClusterUpload`]: a cluster checkpoint being written. Each part the
//! writer sends is cut at stripe boundaries as it arrives ([`Stripes`]);
//! every stripe goes to its holders at once, a few stripes of a part in
//! flight, so memory per part is a few stripes and every node writes
//! while the next stripe arrives. The nodes check, at commit, that their
//! pieces are covered exactly once.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow::buffer::Buffer;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use sluice_flight::checkpoint::data::Encoded;
use sluice_flight::checkpoint::node::NodeCheckpoints;

use super::stripes::Striping;
use super::{ClusterCheckpointError, Result, lock};

/// Stripes of one part sent at once.
const IN_FLIGHT: usize = 4;

/// See the module docs.
#[derive(Debug)]
pub struct ClusterUpload {
    /// The checkpoint.
    pub name: String,
    /// Its pieces' name on every node.
    pub local: String,
    /// Where its stripes go.
    pub striping: Striping,
    /// Node `k` of the striping, and its piece's upload id there.
    pub nodes: Vec<(Arc<NodeCheckpoints>, String)>,
    /// Whether its writer was given passes to write the stripes to the
    /// nodes itself (then no part passes here, and whether it is idle is
    /// the nodes' to say).
    pub direct: bool,
    active: AtomicUsize,
    touched: Mutex<Instant>,
}

/// Counts a part as active while it lives.
struct Active(Arc<ClusterUpload>);

impl Drop for Active {
    fn drop(&mut self) {
        *lock(&self.0.touched) = Instant::now();
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ClusterUpload {
    /// An upload of `name` over `nodes` (each with its piece's upload),
    /// written by its writer directly or not.
    pub fn new(
        name: String,
        local: String,
        striping: Striping,
        nodes: Vec<(Arc<NodeCheckpoints>, String)>,
        direct: bool,
    ) -> Self {
        Self {
            name,
            local,
            striping,
            nodes,
            direct,
            active: AtomicUsize::new(0),
            touched: Mutex::new(Instant::now()),
        }
    }

    /// Whether no part is in flight and none was for `idle`.
    pub fn idle_for(&self, idle: Duration) -> bool {
        self.active.load(Ordering::Acquire) == 0 && lock(&self.touched).elapsed() >= idle
    }

    /// Counts now as its last activity (a direct upload its nodes still
    /// hold open).
    pub fn touch(&self) {
        *lock(&self.touched) = Instant::now();
    }

    /// Tells every node to drop its piece (those that cannot be told drop
    /// it by their own idle timeout).
    pub async fn abort_everywhere(&self) {
        futures::future::join_all(self.nodes.iter().map(|(node, upload)| async move {
            if let Err(e) = node.abort(upload).await {
                tracing::warn!("checkpoint '{}': {e}", self.name);
            }
        }))
        .await;
    }

    /// Writes the part at `offset` (its bytes as they arrive) to the
    /// holders of each of its stripes; its length.
    pub async fn write_part<S>(self: &Arc<Self>, offset: u64, pieces: S) -> Result<u64>
    where
        S: Stream<Item = Result<Buffer>> + Send + 'static,
    {
        self.active.fetch_add(1, Ordering::AcqRel);
        let _active = Active(Arc::clone(self));
        let segments = Stripes::new(Box::pin(pieces), offset, self.striping.unit)
            .into_stream()
            .boxed();
        let me = Arc::clone(self);
        segments
            .map_ok(move |(at, bufs)| Arc::clone(&me).send(at, bufs).boxed())
            .try_buffer_unordered(IN_FLIGHT)
            .try_fold(0u64, |n, sent| futures::future::ready(Ok(n + sent)))
            .await
    }

    /// Sends `bufs`, the bytes at `at` within one stripe, to each of the
    /// stripe's holders at once; their length.
    async fn send(self: Arc<Self>, at: u64, bufs: Vec<Buffer>) -> Result<u64> {
        let s = self.striping.stripe_of(at);
        let within = at - s * self.striping.unit;
        // Encoded once; each holder is sent the same messages.
        let part = Arc::new(Encoded::of(bufs).map_err(|e| {
            ClusterCheckpointError::Call(sluice_base::CallError::Encoding(format!(
                "checkpoint '{}': {e}",
                self.name
            )))
        })?);
        let len = part.bytes;
        let sends: Vec<_> = self
            .striping
            .holders(s)
            .map(|k| {
                let (node, upload) = self.nodes[k as usize].clone();
                let local = self.striping.local_offset(k, s).unwrap_or_default() + within;
                let part = Arc::clone(&part);
                async move { node.put(upload, local, &part).await }
            })
            .collect();
        let sent = futures::future::join_all(sends).await;
        for r in sent {
            r.map_err(|source| ClusterCheckpointError::Node {
                name: self.name.clone(),
                source,
            })?;
        }
        Ok(len)
    }
}

/// A part's bytes cut at stripe boundaries: each item the start of a
/// stretch within one stripe and its buffers (slices of what arrived,
/// never copied). A stretch ends at its stripe's end or the part's.
struct Stripes {
    pieces: Pin<Box<dyn Stream<Item = Result<Buffer>> + Send>>,
    unit: u64,
    /// The next byte's position.
    at: u64,
    /// Where the stretch being gathered starts, and its buffers.
    start: u64,
    gathered: Vec<Buffer>,
    /// What is left of the last piece.
    carry: Option<Buffer>,
    done: bool,
}

impl Stripes {
    /// The stretches of the part at `offset` whose bytes are `pieces`.
    fn new(
        pieces: Pin<Box<dyn Stream<Item = Result<Buffer>> + Send>>,
        offset: u64,
        unit: u64,
    ) -> Self {
        Self {
            pieces,
            unit,
            at: offset,
            start: offset,
            gathered: Vec::new(),
            carry: None,
            done: false,
        }
    }

    /// The next stretch (`None`: the part is over).
    async fn next_stretch(&mut self) -> Option<Result<(u64, Vec<Buffer>)>> {
        loop {
            if let Some(piece) = self.carry.take() {
                let end = (self.at / self.unit + 1) * self.unit;
                let take = (piece.len() as u64).min(end - self.at) as usize;
                self.gathered.push(piece.slice_with_length(0, take));
                if take < piece.len() {
                    self.carry = Some(piece.slice(take));
                }
                self.at += take as u64;
                if self.at == end {
                    return Some(Ok(self.cut()));
                }
                continue;
            }
            if self.done {
                return None;
            }
            match self.pieces.next().await {
                Some(Ok(p)) if p.is_empty() => {}
                Some(Ok(p)) => self.carry = Some(p),
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                None => {
                    self.done = true;
                    if !self.gathered.is_empty() {
                        return Some(Ok(self.cut()));
                    }
                }
            }
        }
    }

    fn cut(&mut self) -> (u64, Vec<Buffer>) {
        let start = std::mem::replace(&mut self.start, self.at);
        (start, std::mem::take(&mut self.gathered))
    }

    /// As a stream.
    fn into_stream(self) -> impl Stream<Item = Result<(u64, Vec<Buffer>)>> + Send {
        futures::stream::unfold(self, |mut s| async move {
            s.next_stretch().await.map(|r| (r, s))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn cut(offset: u64, unit: u64, sizes: &[usize]) -> Vec<(u64, Vec<u8>)> {
        let mut next = 0u8;
        let pieces: Vec<Result<Buffer>> = sizes
            .iter()
            .map(|&n| {
                let v: Vec<u8> = (0..n)
                    .map(|_| {
                        next = next.wrapping_add(1);
                        next
                    })
                    .collect();
                Ok(Buffer::from(v))
            })
            .collect();
        Stripes::new(Box::pin(futures::stream::iter(pieces)), offset, unit)
            .into_stream()
            .map_ok(|(at, bufs)| (at, bufs.iter().flat_map(|b| b.to_vec()).collect()))
            .try_collect()
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_part_is_cut_at_every_stripe_boundary_and_nowhere_else() {
        // A part at 6 in stripes of 4: 6..8, 8..12, 12..13.
        let got = cut(6, 4, &[3, 0, 4]).await;
        assert_eq!(got, [(6, vec![1, 2]), (8, vec![3, 4, 5, 6]), (12, vec![7])]);
        // Many small pieces gather into one stretch; an aligned end adds
        // no empty one.
        let got = cut(0, 4, &[1, 1, 1, 1, 2, 2]).await;
        assert_eq!(got, [(0, vec![1, 2, 3, 4]), (4, vec![5, 6, 7, 8])]);
        assert!(cut(0, 4, &[]).await.is_empty());
    }

    #[tokio::test]
    async fn an_error_of_the_part_ends_it() {
        let pieces: Vec<Result<Buffer>> = vec![
            Ok(Buffer::from(vec![1u8; 6])),
            Err(ClusterCheckpointError::Call(
                sluice_base::CallError::BadRequest("cut".into()),
            )),
        ];
        let got: Vec<_> = Stripes::new(Box::pin(futures::stream::iter(pieces)), 0, 4)
            .into_stream()
            .collect()
            .await;
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok() && got[1].is_err());
    }
}
