//! [`available`]: the memory this process may still use, from which the
//! caches' default budgets and the process's memory budget are shares.
//!
//! `MemAvailable` from `/proc/meminfo` is the host's. A process in a
//! memory cgroup (a container, a systemd slice, a benchmark's fair limit)
//! is killed at its cgroup's limit, well before the host runs short, so
//! where the cgroup's limit less its usage is smaller, that is what is
//! available: cgroup v2's `memory.max` and `memory.current`, or v1's
//! `memory.limit_in_bytes` and `memory.usage_in_bytes`, of the cgroup
//! `/proc/self/cgroup` names. A cgroup that is not mounted where the
//! process can read it, or has no limit, leaves the host's figure.

use std::path::{Path, PathBuf};

/// The memory available to this process now; 0 where it cannot be read.
pub fn available() -> u64 {
    let host = meminfo_available(&read("/proc/meminfo")).unwrap_or(0);
    match cgroup_room(Path::new("/sys/fs/cgroup"), &read("/proc/self/cgroup")) {
        Some(room) if host == 0 || room < host => room,
        _ => host,
    }
}

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `MemAvailable` of a `/proc/meminfo`, in bytes.
fn meminfo_available(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The cgroup's limit less its usage, for the process whose
/// `/proc/self/cgroup` is `membership`, with cgroupfs mounted at `root`:
/// v2 (`0::/path` under `root`) first, then v1's memory controller
/// (`N:memory:/path` under `root/memory`). `None` without a limit.
fn cgroup_room(root: &Path, membership: &str) -> Option<u64> {
    let number = |p: PathBuf| read(p).trim().parse::<u64>().ok();
    for line in membership.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        let (dir, limit, usage) = if controllers.is_empty() {
            (root.join(rel), "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                root.join("memory").join(rel),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        // v1 writes "no limit" as a page-rounded i64::MAX, v2 as "max".
        if let Some(max) = number(dir.join(limit)).filter(|&m| m < 1 << 60) {
            return Some(max.saturating_sub(number(dir.join(usage)).unwrap_or(0)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        let m = "MemTotal:       24000000 kB\nMemAvailable:   12000000 kB\n";
        assert_eq!(meminfo_available(m), Some(12_000_000 * 1024));
        assert_eq!(meminfo_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn a_v2_limit_leaves_its_room() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("bench/side");
        write(&dir, "memory.max", "1073741824\n");
        write(&dir, "memory.current", "268435456\n");
        assert_eq!(
            cgroup_room(root.path(), "0::/bench/side\n"),
            Some(768 << 20)
        );
        write(&dir, "memory.max", "max\n");
        assert_eq!(cgroup_room(root.path(), "0::/bench/side\n"), None);
    }

    #[test]
    fn a_v1_memory_controller_is_found_among_the_others() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("memory/bench");
        write(&dir, "memory.limit_in_bytes", "536870912\n");
        write(&dir, "memory.usage_in_bytes", "600000000\n");
        let membership = "5:devices:/\n4:memory:/bench\n0::/\n";
        // Over its limit (the kernel reclaims): nothing is left.
        assert_eq!(cgroup_room(root.path(), membership), Some(0));
        write(&dir, "memory.limit_in_bytes", "9223372036854771712\n");
        assert_eq!(cgroup_room(root.path(), membership), None);
    }

    #[test]
    fn no_cgroup_leaves_the_host() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(cgroup_room(root.path(), "0::/\n"), None);
        assert_eq!(cgroup_room(root.path(), ""), None);
    }
}
