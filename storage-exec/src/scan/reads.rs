//! Turning a batch of extents into device reads.
//!
//! Rows arrive in metadata order, which for a fresh version is device order.
//! Consecutive rows are *coalesced* into one read while the next extent
//! starts at or after the end of the previous one, the gap between them is
//! small (`max_gap`: reading a few unwanted KiB beats another request) and
//! the read stays under `max_read`. A single extent larger than `max_read`
//! gets a read of its own.
//!
//! Inside a read, rows are cut into *runs* of exactly adjacent extents
//! (each starts where the previous ends). A run becomes one output batch
//! whose Binary `data` column is the read buffer itself with offsets from
//! the metadata — which is only expressible when the values are adjacent,
//! hence the cut at every gap.

use std::ops::Range;

/// One device read and the runs of rows it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadPlan {
    /// Block-aligned device offset.
    pub offset: u64,
    /// Block-aligned length.
    pub len: u64,
    /// Runs of adjacent extents, as row ranges of the input.
    pub runs: Vec<Run>,
}

/// Rows whose extents are adjacent on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// Row range in the input batch.
    pub rows: Range<usize>,
}

/// Plans reads for `extents` (absolute start, length), in row order.
pub fn plan_reads(
    extents: &[(u64, u64)],
    block: u64,
    max_read: u64,
    max_gap: u64,
    max_rows: usize,
) -> Vec<ReadPlan> {
    let mut plans: Vec<ReadPlan> = Vec::new();
    // Unaligned bounds of the current group and its row count.
    let mut group: Option<(u64, u64, usize)> = None;
    for (row, &(start, len)) in extents.iter().enumerate() {
        let end = start + len;
        let joins = group.is_some_and(|(g_start, g_end, rows)| {
            start >= g_end
                && start - g_end <= max_gap
                && end - g_start <= max_read
                && rows < max_rows
        });
        if joins {
            let (g_start, g_end, rows) = group.unwrap_or_default();
            let plan = plans.last_mut().expect("a group has a plan");
            let last_run = plan.runs.last_mut().expect("a plan has a run");
            if start == g_end {
                last_run.rows.end = row + 1;
            } else {
                plan.runs.push(Run { rows: row..row + 1 });
            }
            group = Some((g_start, end.max(g_end), rows + 1));
        } else {
            if let (Some((g_start, g_end, _)), Some(plan)) = (group, plans.last_mut()) {
                finish(plan, g_start, g_end, block);
            }
            plans.push(ReadPlan {
                offset: 0,
                len: 0,
                runs: vec![Run { rows: row..row + 1 }],
            });
            group = Some((start, end, 1));
        }
    }
    if let (Some((g_start, g_end, _)), Some(plan)) = (group, plans.last_mut()) {
        finish(plan, g_start, g_end, block);
    }
    plans
}

fn finish(plan: &mut ReadPlan, start: u64, end: u64, block: u64) {
    plan.offset = start / block * block;
    plan.len = (end.div_ceil(block) * block - plan.offset).max(block);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn adjacent_extents_form_one_read_and_one_run() {
        let ext = [(100, 50), (150, 10), (160, 4000)];
        let plans = plan_reads(&ext, 4096, 1 << 20, 0, 1000);
        assert_eq!(
            plans,
            vec![ReadPlan {
                offset: 0,
                len: 8192,
                runs: vec![Run { rows: 0..3 }]
            }]
        );
    }

    #[test]
    fn small_gaps_coalesce_into_runs_large_gaps_split_reads() {
        let ext = [(0, 10), (20, 10), (30, 10), (1_000_000, 5)];
        let plans = plan_reads(&ext, 4096, 1 << 20, 64 << 10, 1000);
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[0].runs, vec![Run { rows: 0..1 }, Run { rows: 1..3 }]);
        assert_eq!(plans[1].offset, 1_000_000 / 4096 * 4096);
    }

    #[test]
    fn backwards_extents_and_caps_start_new_reads() {
        let plans = plan_reads(&[(8192, 10), (0, 10)], 4096, 1 << 20, 1 << 20, 1000);
        assert_eq!(plans.len(), 2);
        let plans = plan_reads(&[(0, 10), (10, 10), (20, 10)], 4096, 1 << 20, 0, 2);
        assert_eq!(plans.len(), 2, "row cap");
        let plans = plan_reads(&[(0, 3000), (3000, 3000)], 4096, 4096, 0, 100);
        assert_eq!(plans.len(), 2, "size cap");
    }

    proptest! {
        /// Every row is in exactly one run, in order; every run's extents are
        /// adjacent; every read is aligned and covers its rows.
        #[test]
        fn plans_cover_rows_exactly(lens in proptest::collection::vec((0u64..20_000, 0u64..3, 0u64..10_000), 1..200)) {
            let mut pos = 0u64;
            let mut ext = Vec::new();
            for (len, kind, gap) in lens {
                if kind == 1 { pos += gap; }
                ext.push((pos, len));
                pos += len;
            }
            let plans = plan_reads(&ext, 4096, 256 << 10, 8192, 64);
            let mut next = 0usize;
            for p in &plans {
                prop_assert_eq!(p.offset % 4096, 0);
                prop_assert_eq!(p.len % 4096, 0);
                for run in &p.runs {
                    prop_assert_eq!(run.rows.start, next);
                    next = run.rows.end;
                    for r in run.rows.clone() {
                        let (s, l) = ext[r];
                        prop_assert!(s >= p.offset && s + l <= p.offset + p.len);
                        if r > run.rows.start {
                            prop_assert_eq!(ext[r - 1].0 + ext[r - 1].1, s);
                        }
                    }
                }
            }
            prop_assert_eq!(next, ext.len());
        }
    }
}
