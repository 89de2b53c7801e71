//! The SPDK environment of the process, brought up and torn down on the
//! SPDK thread: the DPDK-based env and one `spdk_thread` ([`init`]), the
//! bdev config loaded the way `spdk_tgt --json` does ([`load_bdevs`]),
//! and SPDK's documented tear-down order ([`finish`]). Each asynchronous
//! step is started and then polled on the thread until it calls back.

use std::cell::Cell;
use std::ffi::{CString, c_int, c_void};

use super::SpdkOptions;
use super::ffi::{cstr, errno_text};

/// A bdev as configured, listed when the runtime starts.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BdevInfo {
    /// Bdev name (what `--device bdev:NAME` names).
    pub name: String,
    /// Product name of its module ("AIO disk", "Malloc disk", "NVMe disk").
    pub product: String,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Logical blocks.
    pub num_blocks: u64,
}

/// The SPDK thread's handle.
pub(super) type Thread = *mut spdk_sys::spdk_thread;

/// Where an asynchronous init step reports its result.
#[derive(Default)]
struct Step {
    done: Cell<bool>,
    rc: Cell<c_int>,
}

unsafe extern "C" fn step_done(rc: c_int, ctx: *mut c_void) {
    // SAFETY: `ctx` is the `Step` that `run_step` passed and keeps alive
    // until `done` is set.
    let step = unsafe { &*ctx.cast::<Step>() };
    step.rc.set(rc);
    step.done.set(true);
}

unsafe extern "C" fn fini_done(ctx: *mut c_void) {
    // SAFETY: as in `step_done`.
    let step = unsafe { &*ctx.cast::<Step>() };
    step.done.set(true);
}

/// Starts an asynchronous SPDK step with `start(step_ptr)` and polls the
/// thread until it calls back; returns its status.
///
/// # Safety
/// `thread` must be the current SPDK thread, and `start` must arrange for
/// `step_done`/`fini_done` to be called with the pointer it is given.
unsafe fn run_step(thread: Thread, start: impl FnOnce(*mut c_void)) -> c_int {
    let step = Step::default();
    start(std::ptr::from_ref(&step).cast_mut().cast());
    while !step.done.get() {
        // SAFETY: the caller promises `thread` is the current SPDK thread.
        unsafe { spdk_sys::spdk_thread_poll(thread, 0, 0) };
    }
    step.rc.get()
}

/// Loads `json` for the current RPC state (startup or runtime methods).
///
/// # Safety
/// As [`run_step`].
unsafe fn load_config(thread: Thread, json: &mut [u8]) -> c_int {
    let len = json.len() as isize;
    let ptr = json.as_mut_ptr().cast::<c_void>();
    // SAFETY: SPDK copies the JSON before returning; `step_done` gets the
    // step pointer; we are on the SPDK thread (caller's promise).
    unsafe {
        run_step(thread, |step| {
            spdk_sys::spdk_subsystem_load_config(ptr, len, Some(step_done), step, true)
        })
    }
}

/// Initialises the env (DPDK, pinned to `--spdk-core-mask`) and creates
/// the one `spdk_thread`, made current on the calling thread.
///
/// # Safety
/// On the SPDK thread, once per process.
pub(super) unsafe fn init(opts: &SpdkOptions, no_pci: bool) -> Result<Thread, String> {
    let c = |s: &str| CString::new(s).unwrap_or_default();
    let name = c("sluice");
    let core_mask = c(opts.core_mask.as_deref().unwrap_or("0x1"));
    let hugedir = opts.hugedir.as_ref().map(|d| c(&d.to_string_lossy()));

    // SAFETY: `spdk_env_opts` is a plain C struct; `spdk_env_opts_init`
    // fills every field after reading `opts_size`, which we set first.
    let mut env: spdk_sys::spdk_env_opts = unsafe { std::mem::zeroed() };
    env.opts_size = std::mem::size_of::<spdk_sys::spdk_env_opts>();
    // SAFETY: `env` is a valid, writable `spdk_env_opts`.
    unsafe { spdk_sys::spdk_env_opts_init(&mut env) };
    env.name = name.as_ptr();
    env.core_mask = core_mask.as_ptr();
    env.mem_size = opts.mem_size_mb as c_int;
    env.no_huge = opts.no_huge;
    env.no_pci = no_pci;
    // Hugepage files are unlinked once mapped: nothing is left in
    // /dev/hugepages if the process dies.
    env.unlink_hugepage = !opts.no_huge;
    if let Some(dir) = &hugedir {
        env.hugedir = dir.as_ptr();
    }
    // SAFETY: log level setters only store a global; `env` and the strings it
    // points to outlive the call; this is the one env init of the process.
    let rc = unsafe {
        spdk_sys::spdk_log_set_print_level(spdk_sys::SPDK_LOG_WARN);
        spdk_sys::spdk_env_init(&env)
    };
    if rc < 0 {
        return Err(format!(
            "spdk_env_init failed ({}){}",
            errno_text(-rc),
            if opts.no_huge {
                ""
            } else {
                " — are hugepages reserved (/proc/sys/vm/nr_hugepages) and hugetlbfs \
                 mounted? Without them use the no-huge mode (--spdk-no-huge)"
            }
        ));
    }
    // SAFETY: the env is up; no thread library yet; we are its only user.
    let thread = unsafe {
        spdk_sys::spdk_thread_lib_init(None, 0);
        let t = spdk_sys::spdk_thread_create(name.as_ptr(), std::ptr::null());
        if !t.is_null() {
            spdk_sys::spdk_set_thread(t);
        }
        t
    };
    if thread.is_null() {
        // SAFETY: undoing the two inits above, in reverse order.
        unsafe {
            spdk_sys::spdk_thread_lib_fini();
            spdk_sys::spdk_env_fini();
        }
        return Err("spdk_thread_create failed".into());
    }
    Ok(thread)
}

/// As `spdk_tgt --json`: the startup-state RPCs of `json`, subsystem
/// init, then its runtime-state RPCs (where bdevs are created); the bdevs
/// that made. On failure everything [`init`] made is torn down.
///
/// # Safety
/// On the SPDK thread `thread`, right after [`init`].
pub(super) unsafe fn load_bdevs(thread: Thread, json: &mut [u8]) -> Result<Vec<BdevInfo>, String> {
    // SAFETY: the caller's promises.
    let rc = unsafe {
        let mut rc = load_config(thread, json);
        if rc == 0 {
            rc = run_step(thread, |step| {
                spdk_sys::spdk_subsystem_init(Some(step_done), step)
            });
        }
        if rc == 0 {
            spdk_sys::spdk_rpc_set_state(spdk_sys::SPDK_RPC_RUNTIME);
            rc = load_config(thread, json);
        }
        rc
    };
    if rc != 0 {
        // SAFETY: on the SPDK thread; tears down what init made.
        unsafe { finish(thread) };
        return Err(format!(
            "loading the bdev config failed ({}); SPDK's log above names the method",
            errno_text(-rc)
        ));
    }
    // SAFETY: on the SPDK thread after subsystem init.
    Ok(unsafe { list_bdevs() })
}

/// Names and geometry of every registered bdev.
///
/// # Safety
/// On the SPDK thread, after subsystem init.
unsafe fn list_bdevs() -> Vec<BdevInfo> {
    let mut out = Vec::new();
    // SAFETY: iterating SPDK's bdev list on its thread; every pointer comes
    // from `spdk_bdev_first`/`next` and names NUL-terminated strings owned
    // by the bdev.
    unsafe {
        let mut bdev = spdk_sys::spdk_bdev_first();
        while !bdev.is_null() {
            out.push(BdevInfo {
                name: cstr(spdk_sys::spdk_bdev_get_name(bdev)),
                product: cstr(spdk_sys::spdk_bdev_get_product_name(bdev)),
                block_size: spdk_sys::spdk_bdev_get_block_size(bdev),
                num_blocks: spdk_sys::spdk_bdev_get_num_blocks(bdev),
            });
            bdev = spdk_sys::spdk_bdev_next(bdev);
        }
    }
    out
}

/// Subsystem fini, thread exit, env fini.
///
/// # Safety
/// On the SPDK thread `thread`, with no I/O in flight.
pub(super) unsafe fn finish(thread: Thread) {
    // SAFETY: the caller's promises; each call is the documented tear-down
    // order of an SPDK application (see lib/event/app.c).
    unsafe {
        run_step(thread, |step| {
            spdk_sys::spdk_subsystem_fini(Some(fini_done), step)
        });
        spdk_sys::spdk_rpc_finish();
        spdk_sys::spdk_thread_exit(thread);
        while !spdk_sys::spdk_thread_is_exited(thread) {
            spdk_sys::spdk_thread_poll(thread, 0, 0);
        }
        spdk_sys::spdk_thread_destroy(thread);
        spdk_sys::spdk_thread_lib_fini();
        spdk_sys::spdk_env_fini();
    }
}
