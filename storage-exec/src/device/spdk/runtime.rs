//! [`Runtime`]: the process's one SPDK environment, started with the
//! first SPDK device, and the one thread that polls it.
//!
//! SPDK is started in-process without its application framework (no
//! `spdk_app_start`, no reactors, no signal handlers of its own): a thread
//! sluice owns initialises the DPDK-based environment and loads the bdev
//! configuration ([`env`](super::env)), then polls
//! ([`Reactor::serve`](super::reactor::Reactor::serve)). Everything that
//! touches a bdev runs on this thread: callers send it [`Msg`]s over a
//! channel — a request ([`IoCtx`], one allocation, no closure) or a
//! closure for set-up and tear-down — and it answers I/O through oneshot
//! channels, as the io_uring thread does.
//!
//! The core: DPDK pins this thread to the core of `--spdk-core-mask`, and
//! once SPDK is up the thread takes that core out of every other thread's
//! affinity ([`affinity::isolate`]), as SPDK's own applications dedicate a
//! core to each reactor.
//!
//! One environment per process: DPDK cannot be initialised twice. The
//! first SPDK device opened starts it with its options; later devices must
//! name the same configuration. [`shutdown`] tears it down (subsystems,
//! thread, env) once no device and no DMA buffer is left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::SpdkOptions;
use super::bdev::IoCtx;
use super::config::{parse_config, wants_pci};
use super::env::{self, BdevInfo};
use super::ffi::spdk_error;
use super::reactor::{self, LINGER, Msg, Reactor};
use crate::device::affinity::{self, Isolation};
use crate::error::{Result, StorageError};

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

/// What the SPDK thread reports once it is up: the bdevs and its core.
type Started = std::result::Result<(Vec<BdevInfo>, Isolation), String>;

/// The SPDK thread: env init, config, poll loop, tear-down.
///
/// # Safety
/// Must run on its own OS thread, once per process.
unsafe fn thread_main(
    opts: &SpdkOptions,
    mut json: Vec<u8>,
    no_pci: bool,
    rx: Receiver<Msg>,
    started: Sender<Started>,
) {
    // SAFETY: the caller's promises: this is the SPDK thread, once.
    let up = unsafe { env::init(opts, no_pci) }.and_then(|thread| {
        // SAFETY: on the SPDK thread, right after `init`.
        unsafe { env::load_bdevs(thread, &mut json) }.map(|bdevs| (thread, bdevs))
    });
    let (thread, bdevs) = match up {
        Ok(up) => up,
        Err(msg) => {
            let _ = started.send(Err(msg));
            return;
        }
    };
    reactor::register_exit_hook();
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
    // SAFETY: on the SPDK thread, its config loaded.
    unsafe { Reactor::default().serve(thread, &rx, linger) };
    // SAFETY: on the SPDK thread; nothing in flight; every device is closed
    // (shutdown checked) and its jobs ran.
    unsafe { env::finish(thread) };
    reactor::mark_parked();
}
