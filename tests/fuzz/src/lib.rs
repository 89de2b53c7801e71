//! What sluice's fuzz targets share: the decoding limits they run under
//! and the way a target that mirrors `serve` treats a decoder's panic.
//!
//! In `serve` a panic inside a third-party decoder is caught by the UDF
//! wrapper and becomes one named bad sample; what would take the server
//! down is an abort, a fault in C code, memory growth or a hang. The
//! decoder targets therefore catch panics as `serve` does
//! ([`as_in_serve`]), and libFuzzer reports what is left: crashes, leaks,
//! out-of-memory and timeouts. Targets over sluice's own parsers catch
//! nothing: a panic there is a bug.

use std::panic::{AssertUnwindSafe, catch_unwind};

use sluice_udfs::Limits;

/// Limits small enough for libFuzzer's memory limit (2 GiB) and time per
/// input, far above the seeds.
pub fn limits() -> Limits {
    Limits {
        max_pixels: 1 << 22,
        max_frames: 256,
        max_decoded_bytes: 64 << 20,
        max_sample_ms: 2_000,
    }
}

/// Runs `f` as the UDF wrapper does: a panic is a bad sample, not a crash.
/// Call [`quiet_panics`] from the target's `init` so caught panics do not
/// print or abort.
pub fn as_in_serve<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// Replaces libFuzzer's abort-on-panic hook with a silent one. libFuzzer
/// still aborts on a panic that leaves the target (its runner catches it
/// and aborts), so only the panics [`as_in_serve`] catches pass.
pub fn quiet_panics() {
    std::panic::set_hook(Box::new(|_| {}));
}
