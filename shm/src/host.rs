//! This host's `/dev/shm` as the shared-memory transport sees it:
//! [`verify`], whether a trainer's [`Probe`] shows that it shares it (a
//! file the trainer made there, holding the nonce it sent), and
//! [`sweep`], which removes what processes killed before they could clean
//! up left there.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use sluice_flight::shm_handshake::{PROBE_PREFIX, Probe, SEGMENT_PREFIX, SHM_DIR};

/// Whether the file exists here and holds the nonce; `Err` says why
/// not, naming the file.
pub fn verify(probe: &Probe) -> Result<(), String> {
    let valid = probe.name.starts_with(PROBE_PREFIX)
        && probe.name.len() <= 128
        && probe.name[PROBE_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !valid || probe.nonce.is_empty() || probe.nonce.len() > 64 {
        return Err(format!("probe {:?} is not a sluice probe", probe.name));
    }
    let path = Path::new(SHM_DIR).join(&probe.name);
    let mut held = Vec::with_capacity(64);
    File::open(&path)
        .and_then(|f| f.take(65).read_to_end(&mut held))
        .map_err(|e| {
            format!(
                "the trainer's probe {} is not on this host ({e})",
                path.display()
            )
        })?;
    if held != probe.nonce.as_bytes() {
        return Err(format!(
            "the trainer's probe {} holds another nonce: another host's {SHM_DIR}",
            path.display()
        ));
    }
    Ok(())
}

/// Removes segment files whose server process is gone (killed before it
/// could unlink them), and probes whose trainer process is gone (killed
/// between making one and its server's answer).
pub fn sweep() {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| {
            n.strip_prefix(SEGMENT_PREFIX)
                .or_else(|| n.strip_prefix(PROBE_PREFIX))
        }) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(c) = CString::new(format!("/proc/{pid}")) else {
            continue;
        };
        // SAFETY: `c` is a valid NUL-terminated path; access only stats it.
        let alive = unsafe { libc::access(c.as_ptr(), libc::F_OK) } == 0;
        if !alive {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_checked_and_named() {
        let name = format!("{PROBE_PREFIX}test-{}", std::process::id());
        let path = Path::new(SHM_DIR).join(&name);
        std::fs::write(&path, b"n0nce").unwrap();
        let ok = Probe {
            name: name.clone(),
            nonce: "n0nce".into(),
        };
        assert_eq!(verify(&ok), Ok(()));
        let wrong = Probe {
            name: name.clone(),
            nonce: "other".into(),
        };
        assert!(verify(&wrong).unwrap_err().contains("another nonce"));
        std::fs::remove_file(&path).unwrap();
        assert!(verify(&ok).unwrap_err().contains("not on this host"));
        for bad in ["../etc/passwd", "sluice-probe-../../x", "passwd"] {
            let p = Probe {
                name: bad.into(),
                nonce: "x".into(),
            };
            assert!(
                verify(&p).unwrap_err().contains("not a sluice probe"),
                "{bad}"
            );
        }
    }

    #[test]
    fn sweep_removes_the_files_of_dead_processes_only() {
        // Above the kernel's largest pid: never a live process.
        let dead = 4_194_400;
        let names = [
            format!("{SEGMENT_PREFIX}{dead}-0"),
            format!("{PROBE_PREFIX}{dead}-ab12"),
            format!("{PROBE_PREFIX}{}-cd34", std::process::id()),
        ];
        for n in &names {
            std::fs::write(Path::new(SHM_DIR).join(n), b"x").unwrap();
        }
        sweep();
        let left: Vec<bool> = names
            .iter()
            .map(|n| Path::new(SHM_DIR).join(n).exists())
            .collect();
        let _ = std::fs::remove_file(Path::new(SHM_DIR).join(&names[2]));
        assert_eq!(left, [false, false, true]);
    }
}
