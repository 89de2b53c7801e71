//! A stream's account of its bad samples, apart from the job that owns
//! it so that the rules can be tried alone:
//!
//! - the samples a UDF refused since the last batch travel with the next
//!   batch, as a count and the first ones named (the stream's log keeps
//!   [`sluice_udfs::env::ErrorLog::KEEP`] of them, and counts all);
//! - a sample that came back with no row was skipped by the error policy
//!   or was lost: under `skip`, no more rows may be missing than samples
//!   were refused; under any other policy none may be.

use sluice_base::BadSample;

/// Bad samples met and not yet handed on: how many, and the first ones.
pub type Unsent = (u64, Vec<BadSample>);

/// See the module docs.
#[derive(Debug, Default)]
pub struct BadTally {
    /// Bad samples of the stream's log already taken in.
    reported: u64,
    unsent: Option<Unsent>,
    /// Samples with no row so far.
    missing: u64,
}

impl BadTally {
    /// Takes in the stream's log as it stands: `total` refused so far, and
    /// the first of them (`kept`, in the order met). Those past what was
    /// taken before wait for the next batch.
    pub fn logged(&mut self, total: u64, kept: Vec<BadSample>) {
        if total <= self.reported {
            return;
        }
        let fresh = kept.into_iter().skip(self.reported as usize);
        let (count, named) = self.unsent.get_or_insert_with(|| (0, Vec::new()));
        *count += total - self.reported;
        named.extend(fresh);
        self.reported = total;
    }

    /// Counts `n` more samples that came back with no row; whether every
    /// one so far is accounted for by a refusal, under `skipping` (the
    /// `skip` policy). `n == 0` is always accounted for.
    pub fn missing(&mut self, n: u64, skipping: bool) -> bool {
        self.missing += n;
        n == 0 || (skipping && self.missing <= self.reported)
    }

    /// The bad samples to hand on with the next batch, once.
    pub fn take(&mut self) -> Option<Unsent> {
        self.unsent.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(key: &str) -> BadSample {
        BadSample {
            udf: "decode_image".into(),
            key: key.into(),
            reason: "not an image".into(),
        }
    }

    #[test]
    fn refusals_travel_once_with_the_next_batch() {
        let mut t = BadTally::default();
        assert!(t.take().is_none(), "nothing met, nothing to hand on");
        t.logged(1, vec![bad("a")]);
        // The log as it stands again: nothing new.
        t.logged(1, vec![bad("a")]);
        t.logged(3, vec![bad("a"), bad("b"), bad("c")]);
        let (count, named) = t.take().expect("three met");
        assert_eq!(count, 3);
        let keys: Vec<_> = named.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert!(t.take().is_none(), "handed on once");
        t.logged(4, vec![bad("a"), bad("b"), bad("c"), bad("d")]);
        let (count, named) = t.take().expect("one more");
        assert_eq!((count, named.len(), named[0].key.as_str()), (1, 1, "d"));
    }

    #[test]
    fn refusals_past_what_the_log_keeps_are_counted_not_named() {
        let mut t = BadTally::default();
        t.logged(2, vec![bad("a"), bad("b")]);
        t.take();
        // The log kept only its first two; 5 more were counted.
        t.logged(7, vec![bad("a"), bad("b")]);
        let (count, named) = t.take().expect("five more");
        assert_eq!((count, named.len()), (5, 0));
    }

    #[test]
    fn under_skip_no_more_rows_go_missing_than_were_refused() {
        let mut t = BadTally::default();
        assert!(t.missing(0, true), "a whole window");
        assert!(!t.missing(1, true), "a row lost with nothing refused");
        let mut t = BadTally::default();
        t.logged(2, vec![bad("a"), bad("b")]);
        assert!(t.missing(1, true));
        assert!(t.missing(1, true), "two refused, two missing");
        assert!(!t.missing(1, true), "a third is lost");
    }

    #[test]
    fn under_fail_any_missing_row_is_lost() {
        let mut t = BadTally::default();
        t.logged(1, vec![bad("a")]);
        assert!(t.missing(0, false));
        assert!(!t.missing(1, false));
    }
}
