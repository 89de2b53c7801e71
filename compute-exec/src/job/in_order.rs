//! [`InOrder`]: futures run a bounded number at a time, their results
//! handed on in the order the futures came, without making the work wait
//! for that order.
//!
//! `futures`' `buffered(n)` starts the next future only when the oldest
//! is handed on, so one slow future leaves the others' share of the
//! cores idle: with windows of an epoch that take 70–300 ms each (images
//! differ), the two later windows of three were done and waiting while
//! the first ran on one core of two. [`InOrder`] keeps `running` futures
//! running whatever their order of completion, holding the results that
//! finish before an older one, and takes no new future while `running +
//! held` are taken and not handed on. Its memory is bounded by `running +
//! held` results, as `buffered(running + held)`'s is, but the cores stay
//! busy while the oldest result is late.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use futures::{Future, FutureExt};

/// See the module docs.
pub struct InOrder<S, T> {
    /// The futures not yet started; `None` once it ended.
    source: Option<S>,
    running: FuturesUnordered<BoxFuture<'static, (u64, T)>>,
    /// Results that finished before an older one, by number.
    held: BTreeMap<u64, T>,
    /// Number of the next future taken from `source`.
    issued: u64,
    /// Number of the next result handed on.
    next: u64,
    max_running: usize,
    max_held: usize,
}

impl<S, T> std::fmt::Debug for InOrder<S, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InOrder")
            .field("running", &self.running.len())
            .field("held", &self.held.len())
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl<S, F, T> InOrder<S, T>
where
    S: Stream<Item = F> + Unpin,
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    /// Runs the futures of `source`, at most `running` at a time (at
    /// least one) and at most `running + held` taken and not handed on.
    pub fn new(source: S, running: usize, held: usize) -> Self {
        Self {
            source: Some(source),
            running: FuturesUnordered::new(),
            held: BTreeMap::new(),
            issued: 0,
            next: 0,
            max_running: running.max(1),
            max_held: held,
        }
    }

    /// Keeps the futures running while the caller is busy elsewhere (a
    /// consumer sending the last result on): those that finish are held
    /// and the next ones start, within the same bounds. Never ends: poll
    /// it beside the other work (`select!`), and drop it with that.
    pub fn keep_running(&mut self) -> impl Future<Output = std::convert::Infallible> + '_ {
        std::future::poll_fn(move |cx| {
            self.advance(cx);
            Poll::Pending
        })
    }

    /// Starts futures while there is room, and holds the results of
    /// those that finish, until none finishes now.
    fn advance(&mut self, cx: &mut Context<'_>) {
        loop {
            self.start(cx);
            match self.running.poll_next_unpin(cx) {
                Poll::Ready(Some((n, t))) => {
                    self.held.insert(n, t);
                }
                // Nothing runs (the source ended or is not ready: `start`
                // left its waker there), or nothing finished yet.
                Poll::Ready(None) | Poll::Pending => return,
            }
        }
    }

    /// Takes futures from the source while there is room to run them.
    fn start(&mut self, cx: &mut Context<'_>) {
        while self.running.len() < self.max_running
            && self.running.len() + self.held.len() < self.max_running + self.max_held
        {
            let Some(source) = self.source.as_mut() else {
                return;
            };
            match source.poll_next_unpin(cx) {
                Poll::Ready(Some(f)) => {
                    let n = self.issued;
                    self.issued += 1;
                    self.running.push(f.map(move |t| (n, t)).boxed());
                }
                Poll::Ready(None) => self.source = None,
                Poll::Pending => return,
            }
        }
    }
}

impl<S, F, T> Stream for InOrder<S, T>
where
    S: Stream<Item = F> + Unpin,
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = self.get_mut();
        this.advance(cx);
        if let Some(t) = this.held.remove(&this.next) {
            this.next += 1;
            return Poll::Ready(Some(t));
        }
        // Nothing runs and nothing is held: every result was handed on.
        if this.running.is_empty() && this.source.is_none() {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}
#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::channel::oneshot;

    use super::*;

    /// `n` futures, each done when its sender is used, and the list of
    /// those polled so far.
    type Gated = (
        futures::stream::Iter<std::vec::IntoIter<BoxFuture<'static, usize>>>,
        Vec<oneshot::Sender<()>>,
        Arc<Mutex<Vec<usize>>>,
    );

    fn gated(n: usize) -> Gated {
        let started = Arc::new(Mutex::new(Vec::new()));
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..n).map(|_| oneshot::channel()).unzip();
        let log = Arc::clone(&started);
        let futures: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(i, rx)| {
                let log = Arc::clone(&log);
                async move {
                    log.lock().unwrap().push(i);
                    let _ = rx.await;
                    i
                }
                .boxed()
            })
            .collect();
        (futures::stream::iter(futures), senders, started)
    }

    fn poll<S: Stream + Unpin>(s: &mut S) -> Option<Option<S::Item>> {
        s.next().now_or_never()
    }

    #[test]
    fn later_futures_run_while_the_oldest_is_late_and_order_holds() {
        let (source, mut senders, started) = gated(8);
        let mut s = InOrder::new(source, 2, 4);
        assert_eq!(poll(&mut s), None);
        assert_eq!(*started.lock().unwrap(), [0, 1]);
        // 1..=5 end while 0 runs: each frees its place for the next, until
        // 2 + 4 are taken and not handed on (0 running, 1..=5 held).
        let mut rest = senders.split_off(1);
        for tx in rest.drain(..5) {
            tx.send(()).unwrap();
            assert_eq!(poll(&mut s), None, "0 comes first");
        }
        assert_eq!(*started.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
        assert_eq!((s.running.len(), s.held.len()), (1, 5));
        senders.pop().unwrap().send(()).unwrap();
        for tx in rest {
            tx.send(()).unwrap();
        }
        let out: Vec<usize> = futures::executor::block_on(s.collect());
        assert_eq!(out, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn keep_running_starts_the_next_while_the_consumer_is_away() {
        let (source, mut senders, started) = gated(5);
        let mut s = InOrder::new(source, 2, 1);
        assert_eq!(poll(&mut s), None);
        senders.remove(1).send(()).unwrap();
        // The consumer is busy (it polls only `keep_running`): 1 is held
        // and 2 starts; then the bound (2 + 1) holds.
        assert!(s.keep_running().now_or_never().is_none());
        assert_eq!(*started.lock().unwrap(), [0, 1, 2]);
        senders.remove(1).send(()).unwrap();
        assert!(s.keep_running().now_or_never().is_none());
        assert_eq!(*started.lock().unwrap(), [0, 1, 2]);
        assert_eq!((s.running.len(), s.held.len()), (1, 2));
        for tx in senders {
            tx.send(()).unwrap();
        }
        let out: Vec<usize> = futures::executor::block_on(s.collect());
        assert_eq!(out, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn with_nothing_held_it_is_buffered() {
        // `buffered(2)`: the second done waits for the first, and nothing
        // new starts behind them.
        let (source, mut senders, started) = gated(4);
        let mut s = InOrder::new(source, 2, 0);
        assert_eq!(poll(&mut s), None);
        let rest = senders.split_off(1);
        rest.into_iter().for_each(|tx| tx.send(()).unwrap());
        assert_eq!(poll(&mut s), None);
        assert_eq!(*started.lock().unwrap(), [0, 1]);
        senders.pop().unwrap().send(()).unwrap();
        let out: Vec<usize> = futures::executor::block_on(s.collect());
        assert_eq!(out, [0, 1, 2, 3]);
    }
}
