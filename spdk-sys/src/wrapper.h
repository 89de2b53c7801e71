/* The SPDK headers sluice's bindings are generated from: env (DMA memory),
 * thread, init (subsystems and JSON config), bdev, RPC state, log, version. */
#include <spdk/stdinc.h>
#include <spdk/env.h>
#include <spdk/thread.h>
#include <spdk/init.h>
#include <spdk/rpc.h>
#include <spdk/bdev.h>
#include <spdk/log.h>
#include <spdk/version.h>
