//! A core kept for one thread: the SPDK thread's.
//!
//! SPDK is a polled-mode framework: its thread spins on its core while I/O
//! is in flight, and SPDK's own applications give each reactor a core that
//! nothing else runs on. In a sluice process the same core would otherwise
//! be shared with tokio's workers and the decode pool: each time the kernel
//! hands the core to one of them, every request in flight waits, and each
//! time the SPDK thread sleeps, the next request pays a futex wake to rouse
//! it. So when SPDK starts (DPDK has just pinned the SPDK thread to the core
//! of `--spdk-core-mask`), the SPDK thread calls [`isolate`], which takes
//! that core out of the affinity mask of every other thread of the process.
//! Threads created later inherit their creator's mask, so they stay off it
//! too. A thread whose mask holds nothing but SPDK's cores (a one-core
//! machine, a `taskset` that allows only that core) is left alone, and the
//! core is then shared: the SPDK thread sleeps as soon as it is idle instead
//! of lingering (see `spdk::reactor`).
//!
//! Linux only (`/proc/self/task`, `sched_setaffinity`), like the rest of the
//! storage engine.

use std::collections::HashSet;

/// A set of CPUs, as `sched_{get,set}affinity` take it.
#[derive(Clone, Copy)]
struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// The affinity mask of thread `tid` (0: the calling thread).
    fn of(tid: libc::pid_t) -> std::io::Result<Self> {
        // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed.
        let rc = unsafe {
            libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
        };
        if rc == 0 {
            Ok(Self(set))
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Makes this the affinity mask of thread `tid`.
    fn apply(&self, tid: libc::pid_t) -> std::io::Result<()> {
        // SAFETY: `self.0` is a valid `cpu_set_t` of the size passed.
        let rc = unsafe {
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &self.0)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// The CPUs in the set.
    fn cpus(&self) -> Vec<usize> {
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: `CPU_ISSET` reads one bit of a valid set; `cpu` is
            // below `CPU_SETSIZE`.
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &self.0) })
            .collect()
    }

    /// This set without the CPUs of `other`.
    fn without(&self, other: &Self) -> Self {
        let mut out = *self;
        for cpu in other.cpus() {
            // SAFETY: clears one bit, below `CPU_SETSIZE`, of a valid set.
            unsafe { libc::CPU_CLR(cpu, &mut out.0) };
        }
        out
    }

    /// The set of one CPU.
    #[cfg(test)]
    fn only(cpu: usize) -> Self {
        // SAFETY: all-zero is the empty set; `CPU_SET` sets one bit, below
        // `CPU_SETSIZE` for any CPU this process can see.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            Self(set)
        }
    }

    fn is_empty(&self) -> bool {
        // SAFETY: counts the bits of a valid set.
        unsafe { libc::CPU_COUNT(&self.0) == 0 }
    }
}

/// What [`isolate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    /// The CPUs the SPDK thread runs on.
    pub spdk_cpus: Vec<usize>,
    /// Whether no other thread of the process may run on them now.
    pub dedicated: bool,
    /// Threads whose masks were narrowed.
    pub moved: usize,
}

/// Takes the calling thread's CPUs (the SPDK thread's, just pinned by DPDK)
/// out of every other thread's affinity mask; see the module docs. Narrows
/// masks only: a thread is never given a CPU it did not have.
pub fn isolate() -> Isolation {
    let me = current_tid();
    let spdk = match CpuSet::of(0) {
        Ok(set) => set,
        Err(e) => {
            tracing::warn!("SPDK thread: cannot read its CPU affinity ({e}); sharing its core");
            return Isolation {
                spdk_cpus: Vec::new(),
                dedicated: false,
                moved: 0,
            };
        }
    };
    let mut seen = HashSet::from([me]);
    let mut moved = 0;
    let mut dedicated = true;
    // A thread being created while the list is read may be missed; its
    // creator is then one of the listed threads, and a second pass finds it.
    // Passes end when one finds no thread it had not seen.
    for _ in 0..8 {
        let tids = threads();
        let fresh: Vec<libc::pid_t> = tids.into_iter().filter(|t| seen.insert(*t)).collect();
        if fresh.is_empty() {
            break;
        }
        for tid in fresh {
            let Ok(mask) = CpuSet::of(tid) else {
                continue; // it ended meanwhile
            };
            let narrowed = mask.without(&spdk);
            if narrowed.is_empty() {
                dedicated = false;
                continue;
            }
            if narrowed.cpus() != mask.cpus() {
                match narrowed.apply(tid) {
                    Ok(()) => moved += 1,
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) => {
                        tracing::warn!("cannot move thread {tid} off the SPDK core: {e}");
                        dedicated = false;
                    }
                }
            }
        }
    }
    Isolation {
        spdk_cpus: spdk.cpus(),
        dedicated,
        moved,
    }
}

/// The CPUs thread `tid` (0: the calling thread) may run on.
pub fn cpus_of(tid: libc::pid_t) -> std::io::Result<Vec<usize>> {
    CpuSet::of(tid).map(|set| set.cpus())
}

/// The calling thread's kernel id.
fn current_tid() -> libc::pid_t {
    // SAFETY: `gettid` has no preconditions.
    unsafe { libc::gettid() }
}

/// The ids of the process's threads.
fn threads() -> Vec<libc::pid_t> {
    std::fs::read_dir("/proc/self/task")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_removes_exactly_the_other_sets_cpus() {
        let all = CpuSet::of(0).expect("own affinity");
        let cpus = all.cpus();
        assert!(!cpus.is_empty());
        let first = all.without(&all.without(&CpuSet::only(cpus[0])));
        assert_eq!(first.cpus(), vec![cpus[0]]);
        assert!(all.without(&all).is_empty());
        assert_eq!(all.without(&first).cpus(), cpus[1..].to_vec());
    }

    #[test]
    fn isolating_a_pinned_thread_moves_every_other_thread_off_its_core() {
        let cpus = CpuSet::of(0).expect("own affinity").cpus();
        if cpus.len() < 2 {
            eprintln!("SKIP: this process may use one CPU; there is no other core to move to");
            return;
        }
        // A thread that plays the SPDK thread: pinned to the first CPU, it
        // isolates itself while this thread and a sleeping one look on.
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let bystander = std::thread::spawn(move || {
            let _ = stop_rx.recv();
            CpuSet::of(0).expect("bystander affinity").cpus()
        });
        let pinned = cpus[0];
        let isolation = std::thread::spawn(move || {
            CpuSet::only(pinned).apply(0).expect("pin");
            isolate()
        })
        .join()
        .expect("isolating thread");
        assert_eq!(isolation.spdk_cpus, vec![pinned]);
        assert!(isolation.dedicated);
        assert!(isolation.moved >= 2, "{isolation:?}");
        let mine = CpuSet::of(0).expect("own affinity").cpus();
        assert!(!mine.contains(&pinned), "{mine:?}");
        // Threads made afterwards inherit the narrowed mask.
        let child = std::thread::spawn(|| CpuSet::of(0).expect("child").cpus())
            .join()
            .expect("child");
        assert!(!child.contains(&pinned), "{child:?}");
        stop_tx.send(()).expect("bystander waits");
        let theirs = bystander.join().expect("bystander");
        assert!(!theirs.contains(&pinned), "{theirs:?}");
        // Give every thread of the test process its CPU back (the harness
        // runs other tests beside this one).
        for tid in threads() {
            if let Ok(mut mask) = CpuSet::of(tid) {
                // SAFETY: sets one bit, below `CPU_SETSIZE`, of a valid set.
                unsafe { libc::CPU_SET(pinned, &mut mask.0) };
                let _ = mask.apply(tid);
            }
        }
    }
}
