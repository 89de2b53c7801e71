//! Raw bindings to SPDK: only what sluice's SPDK device uses.
//!
//! Generated at build time by bindgen from the headers of an installed SPDK
//! (see `build.rs` for how it is found and linked). The surface:
//! - env: `spdk_env_opts_init`/`spdk_env_init`/`spdk_env_fini`, DMA memory
//!   (`spdk_dma_zmalloc`, `spdk_dma_free`);
//! - threads: `spdk_thread_*`, polled by a thread sluice owns (no reactor,
//!   no `spdk_app_start`);
//! - init: subsystems and SPDK's JSON config (`spdk_subsystem_*`,
//!   `spdk_rpc_set_state`);
//! - bdev: open, I/O channel, geometry, read/write/flush, `io_wait`;
//! - log levels.
//!
//! Everything here is `unsafe` and follows SPDK's threading rules: most bdev
//! calls must be made on the SPDK thread that opened the descriptor. The
//! safe wrapper is `sluice_storage::device::spdk`.
//!
//! Without the `link` feature the crate is empty and needs no SPDK: it is a
//! workspace member, and `cargo build --workspace` builds it so.

/// The generated bindings. SPDK's C names are kept, so the naming lints are
/// off here and only here.
#[cfg(feature = "link")]
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_debug_implementations,
    unnecessary_transmutes,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod bindings {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

#[cfg(feature = "link")]
pub use bindings::*;

/// The SPDK version the bindings were generated from ("26.05", "26.09-pre").
#[cfg(feature = "link")]
pub fn version() -> String {
    let suffix = std::ffi::CStr::from_bytes_until_nul(SPDK_VERSION_SUFFIX)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut v = format!("{SPDK_VERSION_MAJOR}.{SPDK_VERSION_MINOR:02}");
    if SPDK_VERSION_PATCH != 0 {
        v.push_str(&format!(".{SPDK_VERSION_PATCH}"));
    }
    v + &suffix
}
