//! [`Runtime`]: the SPDK environment and the one thread that polls it.
//!
//! SPDK is started in-process without its application framework (no
//! `spdk_app_start`, no reactors, no signal handlers of its own): a thread
//! sluice owns initialises the DPDK-based environment, creates one
//! `spdk_thread`, loads the bdev configuration in SPDK's JSON format the way
//! `spdk_tgt --json` does (startup RPCs, subsystem init, runtime RPCs), and
//! then polls. Everything that touches a bdev runs on this thread: callers
//! send it [`Msg`]s over a channel — a request ([`IoCtx`], one allocation,
//! no closure) or a closure ([`Job`]) for set-up and tear-down — and it
//! answers I/O through oneshot channels, as the io_uring thread does.
//!
//! The core: DPDK pins this thread to the core of `--spdk-core-mask`, and
//! once SPDK is up the thread takes that core out of every other thread's
//! affinity ([`affinity::isolate`]), as SPDK's own applications dedicate a
//! core to each reactor.
//!
//! Polling: while any I/O is in flight the thread spins on
//! `spdk_thread_poll` (SPDK's model; an NVMe queue pair or an AIO context
//! is reaped by polling, not by interrupts). On a dedicated core it goes on
//! polling for [`LINGER`] after the last completion, so that a steady
//! stream of requests never pays a futex wake to rouse it; then, and at
//! once on a shared core (where spinning would take the core from the
//! threads that submit, measured 5 to 25% slower on two cores), it sleeps
//! on the channel for at most [`IDLE_POLL`] at a time, so timed pollers
//! (NVMe admin queues, hot-plug) still run and an idle server costs no core.
//!
//! One environment per process: DPDK cannot be initialised twice. The
//! first SPDK device opened starts it with its options; later devices must
//! name the same configuration. [`shutdown`] tears it down (subsystems,
//! thread, env) once no device and no DMA buffer is left.

use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::{CStr, CString, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::SpdkOptions;
use super::bdev::{self, IoCtx};
use crate::device::affinity::{self, Isolation};
use crate::error::{Result, StorageError};

/// Longest sleep of an idle SPDK thread before it polls again.
const IDLE_POLL: Duration = Duration::from_millis(1);

/// How long the SPDK thread goes on polling after its last piece of work
/// before it sleeps, when its core is its own.
const LINGER: Duration = Duration::from_millis(1);

/// Set-up or tear-down work for the SPDK thread.
pub(super) type Job = Box<dyn FnOnce(&mut Reactor) + Send>;

/// What other threads send the SPDK thread.
pub(super) enum Msg {
    /// A read, write or flush to submit.
    Io(Box<IoCtx>),
    /// A closure to run on the thread (opening and closing bdevs).
    Call(Job),
    /// Finish SPDK and end the thread (sent by [`shutdown`]).
    Stop,
}

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

/// The running SPDK environment.
#[derive(Debug)]
pub(super) struct Runtime {
    options: SpdkOptions,
    tx: Sender<Msg>,
    thread: Mutex<Option<JoinHandle<()>>>,
    bdevs: Vec<BdevInfo>,
    /// The SPDK thread's CPUs, and whether they are its alone.
    core: Isolation,
    /// Live DMA allocations (see `SpdkDma`).
    pub(super) dma_live: Arc<AtomicUsize>,
    /// Open devices.
    pub(super) devices: AtomicUsize,
}

/// The process's runtime: not started, running, failed to start, or shut
/// down. The last two are final: DPDK cannot be initialised again.
enum State {
    Idle,
    Running(Arc<Runtime>),
    Failed(String),
    Stopped,
}

static STATE: Mutex<State> = Mutex::new(State::Idle);

/// Set by [`at_exit`]: the SPDK thread stops touching SPDK and parks.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Set by the SPDK thread once it has parked (or ended).
static PARKED: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// Runs at process exit (registered with `atexit` when SPDK starts),
/// before the C destructors of the SPDK and DPDK libraries linked into the
/// executable: without it the SPDK thread would go on polling structures
/// those destructors free. A process that called [`shutdown`] has nothing
/// left to stop.
extern "C" fn at_exit() {
    EXITING.store(true, Ordering::Release);
    let (lock, parked) = &PARKED;
    let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    // The thread notices within one poll (at most `IDLE_POLL` when idle).
    let _ = parked.wait_timeout_while(guard, Duration::from_secs(1), |p| !*p);
}

/// Tells [`at_exit`] that the SPDK thread no longer touches SPDK.
fn mark_parked() {
    let (lock, parked) = &PARKED;
    *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
    parked.notify_all();
}

/// The runtime, started with `opts` if this is the first SPDK device.
pub(super) fn runtime(opts: &SpdkOptions) -> Result<Arc<Runtime>> {
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    match &*state {
        State::Running(rt) if rt.options.config == opts.config => Ok(Arc::clone(rt)),
        State::Running(rt) => Err(spdk_error(format!(
            "SPDK is already running in this process with config {}; one process \
             loads one bdev config, so {} cannot be loaded too",
            rt.options.config.display(),
            opts.config.display()
        ))),
        State::Stopped => Err(spdk_error(
            "SPDK was shut down in this process and cannot start again (DPDK is \
             initialised once per process)"
                .into(),
        )),
        State::Failed(msg) => Err(spdk_error(format!(
            "SPDK failed to start earlier in this process: {msg}"
        ))),
        State::Idle => match Runtime::start(opts.clone()) {
            Ok(rt) => {
                let rt = Arc::new(rt);
                *state = State::Running(Arc::clone(&rt));
                Ok(rt)
            }
            Err(e) => {
                *state = State::Failed(e.to_string());
                Err(e)
            }
        },
    }
}

/// The bdevs of the running runtime, if SPDK is running in this process.
pub fn bdevs() -> Option<Vec<BdevInfo>> {
    match &*STATE.lock().unwrap_or_else(|p| p.into_inner()) {
        State::Running(rt) => Some(rt.bdevs.clone()),
        _ => None,
    }
}

/// The SPDK thread's CPUs and whether no other thread of the process runs
/// on them, if SPDK is running in this process.
pub fn core() -> Option<Isolation> {
    match &*STATE.lock().unwrap_or_else(|p| p.into_inner()) {
        State::Running(rt) => Some(rt.core.clone()),
        _ => None,
    }
}

/// Stops SPDK in this process: subsystems (which close the bdevs'
/// backing files or detach NVMe controllers), the SPDK thread and the
/// environment. A no-op when SPDK was never started. Refused while a
/// device is open or a DMA buffer is alive (an Arrow array made from a
/// read still holds one): the environment would be freed under it.
pub fn shutdown() -> Result<()> {
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let State::Running(rt) = &*state else {
        return Ok(());
    };
    let devices = rt.devices.load(Ordering::Acquire);
    let live = rt.dma_live.load(Ordering::Acquire);
    if devices > 0 || live > 0 {
        return Err(spdk_error(format!(
            "cannot shut SPDK down: {devices} device(s) open, {live} DMA buffer(s) alive"
        )));
    }
    let rt = Arc::clone(rt);
    *state = State::Stopped;
    drop(state);
    // The poll loop finishes SPDK and ends; messages sent after this one
    // fail (the receiver is gone), and any still queued are dropped with it,
    // so their oneshot replies report a stopped thread rather than hang.
    let _ = rt.tx.send(Msg::Stop);
    if let Some(thread) = rt.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
        thread
            .join()
            .map_err(|_| spdk_error("the SPDK thread panicked during shutdown".into()))?;
    }
    Ok(())
}

impl Runtime {
    /// Starts the SPDK thread and waits until the config is loaded.
    fn start(options: SpdkOptions) -> Result<Self> {
        let json = std::fs::read(&options.config)
            .map_err(|e| StorageError::io("read SPDK config", &options.config, e))?;
        let config = parse_config(&json)
            .map_err(|msg| spdk_error(format!("{}: {msg}", options.config.display())))?;
        let no_pci = !wants_pci(&config);
        let (tx, rx) = mpsc::channel::<Msg>();
        let (started_tx, started_rx) = mpsc::channel();
        let thread_opts = options.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-spdk".into())
            .spawn(move || {
                // SAFETY: this is the SPDK thread: the only thread that calls
                // the env/thread/bdev functions below, once per process (the
                // STATE lock guarantees one start).
                unsafe { thread_main(&thread_opts, json, no_pci, rx, started_tx) }
            })
            .map_err(|e| StorageError::io("spawn the SPDK thread for", &options.config, e))?;
        match started_rx.recv() {
            Ok(Ok((bdevs, core))) => Ok(Self {
                options,
                tx,
                core,
                thread: Mutex::new(Some(thread)),
                bdevs,
                dma_live: Arc::new(AtomicUsize::new(0)),
                devices: AtomicUsize::new(0),
            }),
            Ok(Err(msg)) => {
                let _ = thread.join();
                Err(spdk_error(format!("{}: {msg}", options.config.display())))
            }
            Err(_) => {
                let _ = thread.join();
                Err(spdk_error(format!(
                    "{}: the SPDK thread ended during start-up",
                    options.config.display()
                )))
            }
        }
    }

    /// The bdevs the config created.
    pub(super) fn bdevs(&self) -> &[BdevInfo] {
        &self.bdevs
    }

    /// Queues `msg` for the SPDK thread.
    fn send(&self, msg: Msg) -> Result<()> {
        self.tx
            .send(msg)
            .map_err(|_| spdk_error("the SPDK thread has stopped".into()))
    }

    /// Queues a request for the SPDK thread; its reply comes on the
    /// request's oneshot channel.
    pub(super) fn submit_io(&self, io: Box<IoCtx>) -> Result<()> {
        self.send(Msg::Io(io))
    }

    /// Runs `f` on the SPDK thread and waits for its result (for set-up and
    /// tear-down, not for I/O).
    pub(super) fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Reactor) -> R + Send + 'static,
    ) -> Result<R> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Msg::Call(Box::new(move |reactor| {
            let _ = tx.send(f(reactor));
        })))?;
        rx.recv()
            .map_err(|_| spdk_error("the SPDK thread dropped a request".into()))
    }
}

/// The SPDK thread's own state, handed to every [`Job`].
#[derive(Default)]
pub(super) struct Reactor {
    /// Submissions SPDK refused for lack of `spdk_bdev_io`s (`-ENOMEM`),
    /// retried in order after the next poll.
    retry: VecDeque<Box<IoCtx>>,
    /// Work to run once nothing is in flight (closing a descriptor).
    when_quiet: Vec<Job>,
}

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor")
            .field("in_flight", &in_flight())
            .field("retry", &self.retry.len())
            .finish()
    }
}

impl Reactor {
    /// Retries `io` after the next poll (SPDK ran out of `spdk_bdev_io`s).
    pub(super) fn retry_later(&mut self, io: Box<IoCtx>) {
        self.retry.push_back(io);
    }

    /// Handles one message; returns whether it was [`Msg::Stop`].
    fn handle(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Io(io) => bdev::submit(io, self),
            Msg::Call(job) => job(self),
            Msg::Stop => return true,
        }
        false
    }

    /// Runs `job` once no I/O is in flight.
    pub(super) fn when_quiet(&mut self, job: Job) {
        self.when_quiet.push(job);
    }
}

thread_local! {
    /// I/Os submitted to SPDK and not yet completed (SPDK thread only).
    static IN_FLIGHT: Cell<usize> = const { Cell::new(0) };
}

/// Counts an I/O submitted to SPDK.
pub(super) fn io_started() {
    IN_FLIGHT.with(|n| n.set(n.get() + 1));
}

/// Counts an I/O completed by SPDK.
pub(super) fn io_finished() {
    IN_FLIGHT.with(|n| n.set(n.get().saturating_sub(1)));
}

fn in_flight() -> usize {
    IN_FLIGHT.with(Cell::get)
}

/// The config's JSON, checked for the shape SPDK reads before SPDK sees it:
/// SPDK reports a file that is not JSON, or one without a `subsystems`
/// list, only as "Invalid argument".
fn parse_config(json: &[u8]) -> std::result::Result<serde_json::Value, String> {
    const SHAPE: &str =
        r#"{"subsystems": [{"subsystem": "bdev", "config": [{"method": ..., "params": {...}}]}]}"#;
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("not a JSON bdev config: {e}"))?;
    let subsystems = value
        .get("subsystems")
        .and_then(|s| s.as_array())
        .ok_or_else(|| {
            format!("the bdev config has no \"subsystems\" list; SPDK expects {SHAPE}")
        })?;
    for (i, s) in subsystems.iter().enumerate() {
        if s.get("subsystem").and_then(|n| n.as_str()).is_none() {
            return Err(format!(
                "subsystems[{i}] names no \"subsystem\"; SPDK expects {SHAPE}"
            ));
        }
    }
    Ok(value)
}

/// Whether the config attaches NVMe controllers over PCIe, so the
/// environment must scan the PCI bus; file and malloc bdevs need no scan
/// (and no access to /sys/bus/pci or vfio).
fn wants_pci(value: &serde_json::Value) -> bool {
    let subsystems = value.get("subsystems").and_then(|s| s.as_array());
    subsystems.into_iter().flatten().any(|s| {
        s.get("config")
            .and_then(|c| c.as_array())
            .into_iter()
            .flatten()
            .any(|m| {
                m.get("method").and_then(|m| m.as_str()) == Some("bdev_nvme_attach_controller")
                    && m.get("params")
                        .and_then(|p| p.get("trtype"))
                        .and_then(|t| t.as_str())
                        .is_some_and(|t| t.eq_ignore_ascii_case("pcie"))
            })
    })
}

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
unsafe fn run_step(thread: *mut spdk_sys::spdk_thread, start: impl FnOnce(*mut c_void)) -> c_int {
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
unsafe fn load_config(thread: *mut spdk_sys::spdk_thread, json: &mut [u8]) -> c_int {
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

/// The SPDK thread: env init, config, poll loop, tear-down.
///
/// # Safety
/// Must run on its own OS thread, once per process.
unsafe fn thread_main(
    opts: &SpdkOptions,
    mut json: Vec<u8>,
    no_pci: bool,
    rx: Receiver<Msg>,
    started: Sender<std::result::Result<(Vec<BdevInfo>, Isolation), String>>,
) {
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
        let _ = started.send(Err(format!(
            "spdk_env_init failed ({}){}",
            errno_text(-rc),
            if opts.no_huge {
                String::new()
            } else {
                " — are hugepages reserved (/proc/sys/vm/nr_hugepages) and hugetlbfs \
                 mounted? Without them use the no-huge mode (--spdk-no-huge)"
                    .into()
            }
        )));
        return;
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
        let _ = started.send(Err("spdk_thread_create failed".into()));
        // SAFETY: undoing the two inits above, in reverse order.
        unsafe {
            spdk_sys::spdk_thread_lib_fini();
            spdk_sys::spdk_env_fini();
        }
        return;
    }

    // As `spdk_tgt --json`: startup-state RPCs, subsystem init, then the
    // runtime-state RPCs (where bdevs are created).
    // SAFETY: we are on the SPDK thread just made current.
    let rc = unsafe {
        let mut rc = load_config(thread, &mut json);
        if rc == 0 {
            rc = run_step(thread, |step| {
                spdk_sys::spdk_subsystem_init(Some(step_done), step)
            });
        }
        if rc == 0 {
            spdk_sys::spdk_rpc_set_state(spdk_sys::SPDK_RPC_RUNTIME);
            rc = load_config(thread, &mut json);
        }
        rc
    };
    if rc != 0 {
        let _ = started.send(Err(format!(
            "loading the bdev config failed ({}); SPDK's log above names the method",
            errno_text(-rc)
        )));
        // SAFETY: on the SPDK thread; tears down what init made.
        unsafe { finish(thread) };
        return;
    }
    // SAFETY: on the SPDK thread after subsystem init.
    let bdevs = unsafe { list_bdevs() };
    // SAFETY: registers a plain `extern "C"` function with no arguments.
    if unsafe { libc::atexit(at_exit) } != 0 {
        tracing::warn!("cannot register SPDK's exit hook; the process may fault at exit");
    }
    let core = affinity::isolate();
    tracing::info!(
        "SPDK thread on CPU {:?}: {}",
        core.spdk_cpus,
        if core.dedicated {
            format!("dedicated ({} other threads moved off it)", core.moved)
        } else {
            "shared with other threads (the process may use no other CPU)".to_owned()
        }
    );
    let linger = if core.dedicated {
        LINGER
    } else {
        Duration::ZERO
    };
    let _ = started.send(Ok((bdevs, core)));

    let mut reactor = Reactor::default();
    // When the thread last ran out of work (None: it has work now).
    let mut idle_since: Option<Instant> = None;
    let mut closed = false;
    loop {
        if EXITING.load(Ordering::Acquire) {
            // The process is exiting under us: stop touching SPDK, whose
            // memory the C destructors are about to free.
            mark_parked();
            loop {
                std::thread::park();
            }
        }
        // Drain new work without blocking.
        let mut received = false;
        while !closed {
            match rx.try_recv() {
                Ok(msg) => {
                    received = true;
                    closed = reactor.handle(msg);
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => closed = true,
            }
        }
        // SAFETY: `thread` is the current SPDK thread.
        unsafe { spdk_sys::spdk_thread_poll(thread, 0, 0) };
        for _ in 0..reactor.retry.len() {
            if let Some(io) = reactor.retry.pop_front() {
                bdev::submit(io, &mut reactor);
            }
        }
        if in_flight() > 0 || !reactor.retry.is_empty() {
            idle_since = None;
            continue;
        }
        for job in std::mem::take(&mut reactor.when_quiet) {
            job(&mut reactor);
        }
        if closed {
            break;
        }
        // Lingering starts at the last request or completion; SPDK's timed
        // pollers, which run on every poll, do not restart it.
        if received {
            idle_since = None;
        }
        let idle = *idle_since.get_or_insert_with(Instant::now);
        if idle.elapsed() < linger {
            std::hint::spin_loop();
            continue;
        }
        match rx.recv_timeout(IDLE_POLL) {
            Ok(msg) => {
                idle_since = None;
                closed = reactor.handle(msg);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => closed = true,
        }
    }
    // SAFETY: on the SPDK thread; nothing in flight; every device is closed
    // (shutdown checked) and its jobs ran.
    unsafe { finish(thread) };
    mark_parked();
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
unsafe fn finish(thread: *mut spdk_sys::spdk_thread) {
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

/// A C string SPDK owns, copied.
///
/// # Safety
/// `ptr` is null or a NUL-terminated string.
pub(super) unsafe fn cstr(ptr: *const std::ffi::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

/// `strerror` text for an errno.
pub(super) fn errno_text(errno: c_int) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

/// An error of the SPDK backend.
pub(super) fn spdk_error(msg: String) -> StorageError {
    StorageError::Spdk(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_that_spdk_would_only_call_invalid_are_named() {
        let err = parse_config(b"subsystems: [").unwrap_err();
        assert!(err.starts_with("not a JSON bdev config"), "{err}");
        let err = parse_config(br#"{"bdev": []}"#).unwrap_err();
        assert!(err.contains("no \"subsystems\" list"), "{err}");
        let err = parse_config(br#"{"subsystems": [{"config": []}]}"#).unwrap_err();
        assert!(err.contains("subsystems[0]"), "{err}");
        let ok = parse_config(br#"{"subsystems": [{"subsystem": "bdev", "config": []}]}"#);
        assert!(ok.is_ok());
    }

    #[test]
    fn only_a_pcie_controller_asks_for_the_pci_bus() {
        let config = |method: &str, params: &str| {
            parse_config(
                format!(
                    r#"{{"subsystems": [{{"subsystem": "bdev", "config": [{{"method": "{method}", "params": {params}}}]}}]}}"#
                )
                .as_bytes(),
            )
            .unwrap()
        };
        assert!(wants_pci(&config(
            "bdev_nvme_attach_controller",
            r#"{"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:5e:00.0"}"#
        )));
        assert!(!wants_pci(&config(
            "bdev_nvme_attach_controller",
            r#"{"name": "Nvme0", "trtype": "TCP", "traddr": "192.0.2.1"}"#
        )));
        assert!(!wants_pci(&config(
            "bdev_aio_create",
            r#"{"name": "aio0", "filename": "/x"}"#
        )));
    }
}
