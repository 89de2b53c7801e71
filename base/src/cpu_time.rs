//! The CPU time this process has used: what a storage node reports when
//! it times a fragment for calibration and in its node info, and what a
//! running job compares with the wall clock to see which side is busy.
//!
//! It is the whole process's time (every thread of the node's runtime), so
//! a node timing a fragment while it serves others counts their work too;
//! calibration runs at submission, on nodes that are otherwise idle in the
//! common case, and a busy node only overstates its stages' cost.

/// CPU time of this process (user and system, every thread), ns.
pub fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the
    // call, and CLOCK_PROCESS_CPUTIME_ID is a clock every Linux has.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::process_cpu_ns;

    #[test]
    fn work_shows_up_as_cpu_time() {
        let before = process_cpu_ns();
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let used = process_cpu_ns() - before;
        assert!(used >= 10_000_000, "{used} ns for 30 ms of spinning");
    }
}
