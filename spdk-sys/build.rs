//! Finds an installed SPDK, generates bindings from its headers and links it
//! (with the `link` feature; without it there is nothing to build).
//!
//! Where SPDK is found, in order:
//! 1. `SPDK_DIR`: an SPDK build tree (`$SPDK_DIR/build/lib/pkgconfig`) or an
//!    install prefix (`$SPDK_DIR/lib/pkgconfig`, or `lib64`);
//! 2. pkg-config's own search path (an SPDK installed with `make install`).
//!
//! Linking follows SPDK's own advice (doc/pkgconfig.md). Its subsystems, bdev
//! modules and DPDK drivers register themselves from C constructors that
//! nothing references, so a linker that drops "unused" code drops them and
//! opening a bdev fails with -ENODEV. Hence:
//! - SPDK's static libraries (`libspdk_*.a`) are linked `+whole-archive`,
//!   and so is DPDK when SPDK built its own (static) copy;
//! - shared SPDK libraries are refused: rustc links `--as-needed` and its
//!   `-as-needed` modifier is unstable, so they would be dropped;
//! - a distribution's shared DPDK is linked as is: its EAL loads the
//!   drivers nothing references as plugins from its PMD directory;
//! - the system libraries they need come from the `spdk_syslibs` package.
//!
//! Bindgen (libclang) cannot lay out some packed NVMe structures that the bdev
//! header pulls in (`spdk_nvme_ctrlr_data`, `spdk_nvme_cmd` and its cdw
//! unions, `spdk_bdev_ext_io_opts`), and sluice never touches them: they are
//! made opaque. `static inline` helpers are not bound.

fn main() {
    #[cfg(feature = "link")]
    spdk::main();
}

/// Everything below runs only with the `link` feature.
#[cfg(feature = "link")]
mod spdk {
    use std::env;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// The pkg-config packages sluice links: the DPDK-based env, subsystem init
    /// and JSON config, threads, the bdev layer with its subsystem (accel, iobuf,
    /// sock, keyring and vmd come with it), and the bdev modules a config may
    /// name: NVMe over PCIe for servers, AIO, io_uring and malloc for files and
    /// tests.
    const PACKAGES: &[&str] = &[
        "spdk_env_dpdk",
        "spdk_init",
        "spdk_thread",
        "spdk_log",
        "spdk_bdev",
        "spdk_event_bdev",
        "spdk_bdev_malloc",
        "spdk_bdev_aio",
        "spdk_bdev_uring",
        "spdk_bdev_nvme",
    ];

    pub fn main() {
        println!("cargo:rerun-if-env-changed=SPDK_DIR");
        println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
        println!("cargo:rerun-if-changed=src/wrapper.h");

        let pkg_config_path = pkg_config_path();
        let pkg = |args: &[&str]| -> String {
            let mut cmd = Command::new("pkg-config");
            if let Some(path) = &pkg_config_path {
                cmd.env("PKG_CONFIG_PATH", join_path(path));
            }
            let out = cmd.args(args).output().unwrap_or_else(|e| {
                fail(&format!(
                    "cannot run pkg-config ({e}); install it to locate SPDK"
                ))
            });
            if !out.status.success() {
                fail(&format!(
                    "pkg-config {} failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };

        let exists = |package: &str| {
            let mut cmd = Command::new("pkg-config");
            if let Some(path) = &pkg_config_path {
                cmd.env("PKG_CONFIG_PATH", join_path(path));
            }
            cmd.args(["--exists", package])
                .status()
                .is_ok_and(|s| s.success())
        };
        if !exists("spdk_bdev") {
            fail(
                "SPDK not found: set SPDK_DIR to an SPDK build tree or install prefix \
                 (one with lib/pkgconfig/spdk_bdev.pc), or add SPDK's pkgconfig \
                 directory to PKG_CONFIG_PATH",
            );
        }
        let mut packages: Vec<&str> = PACKAGES.to_vec();
        // `spdk_syslibs` lists the system libraries of a static build (ssl,
        // uuid, aio, uring, numa, isa-l, ...).
        if exists("spdk_syslibs") {
            packages.push("spdk_syslibs");
        }

        let cflags = pkg(&[&["--cflags"][..], &packages].concat());
        let libs = pkg(&[&["--libs", "--static"][..], &packages].concat());
        let lib_dir = libs
            .split_whitespace()
            .filter_map(|t| t.strip_prefix("-L"))
            .map(PathBuf::from)
            .find(|d| d.join("libspdk_bdev.a").is_file() || d.join("libspdk_bdev.so").is_file())
            .unwrap_or_else(|| fail("pkg-config names no directory holding libspdk_bdev"));
        println!("cargo:libdir={}", lib_dir.display());
        link(&libs, &lib_dir);
        bind(&cflags);
    }

    /// The pkgconfig directories named by `SPDK_DIR`, ahead of `PKG_CONFIG_PATH`.
    fn pkg_config_path() -> Option<Vec<PathBuf>> {
        let dir = PathBuf::from(env::var_os("SPDK_DIR")?);
        let candidates = ["build/lib/pkgconfig", "lib/pkgconfig", "lib64/pkgconfig"];
        let found: Vec<PathBuf> = candidates
            .iter()
            .map(|c| dir.join(c))
            .filter(|p| p.join("spdk_bdev.pc").is_file())
            .collect();
        if found.is_empty() {
            fail(&format!(
                "SPDK_DIR={} holds no spdk_bdev.pc under {}: is it an SPDK build tree \
             (after `make`) or install prefix?",
                dir.display(),
                candidates.join(", ")
            ));
        }
        let mut path = found;
        if let Some(existing) = env::var_os("PKG_CONFIG_PATH") {
            path.extend(env::split_paths(&existing));
        }
        Some(path)
    }

    fn join_path(path: &[PathBuf]) -> std::ffi::OsString {
        env::join_paths(path).expect("pkgconfig directories without ':'")
    }

    /// Emits the link lines for `libs` (pkg-config `--libs --static` output).
    ///
    /// Static archives are preferred where SPDK's tree has them, so the binary
    /// needs no SPDK library at run time: SPDK's own `libspdk_*.a` whole, and
    /// the dependencies it built in its tree (isa-l) as plain archives. DPDK and
    /// the system libraries are linked shared.
    fn link(libs: &str, spdk_lib_dir: &Path) {
        let root = spdk_root(spdk_lib_dir).to_owned();
        let mut search: Vec<PathBuf> = vec![spdk_lib_dir.to_owned()];
        let mut tokens: Vec<String> = Vec::new();
        for token in libs.split_whitespace() {
            // Newer SPDK lists what it built in its tree (isa-l) as the
            // archive's path, not as `-L DIR -lNAME`: taken as the same.
            let archive = Path::new(token);
            let named = archive
                .file_name()
                .and_then(|f| f.to_str())
                .and_then(|f| f.strip_prefix("lib")?.strip_suffix(".a"));
            let (dir, token) = match (token.strip_prefix("-L"), named, archive.parent()) {
                (Some(dir), _, _) => (Some(PathBuf::from(dir)), token.to_owned()),
                (None, Some(name), Some(parent)) if archive.is_absolute() => {
                    (Some(parent.to_owned()), format!("-l{name}"))
                }
                _ => (None, token.to_owned()),
            };
            if let Some(dir) = dir.filter(|d| !search.contains(d)) {
                search.push(dir);
            }
            tokens.push(token);
        }
        for dir in &search {
            println!("cargo:rustc-link-search=native={}", dir.display());
        }
        let archive_in = |name: &str, within: Option<&Path>| {
            search.iter().any(|d| {
                within.is_none_or(|w| d.starts_with(w)) && d.join(format!("lib{name}.a")).is_file()
            })
        };
        let mut seen = std::collections::HashSet::new();
        for name in tokens.iter().filter_map(|t| t.strip_prefix("-l")) {
            if !seen.insert(name) {
                continue;
            }
            let is_spdk = name.starts_with("spdk_");
            let is_dpdk = name.starts_with("rte_");
            if (is_spdk || is_dpdk) && archive_in(name, Some(&root)) {
                // Constructors register subsystems, modules and drivers: keep
                // every object of the archive.
                println!("cargo:rustc-link-lib=static:+whole-archive,-bundle={name}");
            } else if is_spdk {
                // A shared SPDK library nothing references would be dropped
                // (rustc links `--as-needed`, and its `-as-needed` modifier is
                // not stable), taking its module with it.
                fail(&format!(
                    "lib{name}.a not found next to SPDK's other libraries: sluice links \
                 SPDK statically (every SPDK build makes the .a files)"
                ));
            } else if archive_in(name, Some(&root)) {
                // A dependency SPDK built in its own tree (isa-l).
                println!("cargo:rustc-link-lib=static:-bundle={name}");
            } else {
                // The system's libraries, and a distribution's shared DPDK:
                // its EAL loads the drivers nothing references (mempool ring,
                // PCI bus) as plugins from its PMD directory at start-up.
                println!("cargo:rustc-link-lib={name}");
            }
        }
    }

    /// The SPDK source tree or install prefix a library directory belongs to.
    fn spdk_root(lib_dir: &Path) -> &Path {
        let tree = lib_dir
            .ancestors()
            .find(|a| a.join("mk/spdk.common.mk").is_file());
        let prefix = || {
            lib_dir
                .ancestors()
                .find(|a| a.join("include/spdk/version.h").is_file())
        };
        tree.or_else(prefix).unwrap_or(lib_dir)
    }

    /// Generates `bindings.rs` for the headers in `src/wrapper.h`.
    fn bind(cflags: &str) {
        let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
        let mut builder = bindgen::Builder::default()
            .header("src/wrapper.h")
            .clang_args(cflags.split_whitespace())
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
            .allowlist_function("spdk_env_opts_init")
            .allowlist_function("spdk_env_init")
            .allowlist_function("spdk_env_fini")
            .allowlist_function("spdk_env_get_core_count")
            .allowlist_function("spdk_dma_zmalloc")
            .allowlist_function("spdk_dma_free")
            .allowlist_function("spdk_thread_lib_init")
            .allowlist_function("spdk_thread_lib_fini")
            .allowlist_function("spdk_thread_create")
            .allowlist_function("spdk_thread_exit")
            .allowlist_function("spdk_thread_is_exited")
            .allowlist_function("spdk_thread_destroy")
            .allowlist_function("spdk_thread_poll")
            .allowlist_function("spdk_thread_has_active_pollers")
            .allowlist_function("spdk_thread_is_idle")
            .allowlist_function("spdk_set_thread")
            .allowlist_function("spdk_put_io_channel")
            .allowlist_function("spdk_subsystem_init")
            .allowlist_function("spdk_subsystem_load_config")
            .allowlist_function("spdk_subsystem_fini")
            .allowlist_function("spdk_rpc_set_state")
            .allowlist_function("spdk_rpc_finish")
            .allowlist_function("spdk_bdev_open_ext")
            .allowlist_function("spdk_bdev_close")
            .allowlist_function("spdk_bdev_desc_get_bdev")
            .allowlist_function("spdk_bdev_get_io_channel")
            .allowlist_function("spdk_bdev_get_name")
            .allowlist_function("spdk_bdev_get_product_name")
            .allowlist_function("spdk_bdev_get_block_size")
            .allowlist_function("spdk_bdev_get_num_blocks")
            .allowlist_function("spdk_bdev_get_buf_align")
            .allowlist_function("spdk_bdev_first")
            .allowlist_function("spdk_bdev_next")
            .allowlist_function("spdk_bdev_io_type_supported")
            .allowlist_function("spdk_bdev_read")
            .allowlist_function("spdk_bdev_write")
            .allowlist_function("spdk_bdev_flush")
            .allowlist_function("spdk_bdev_free_io")
            .allowlist_function("spdk_bdev_queue_io_wait")
            .allowlist_function("spdk_log_set_print_level")
            .allowlist_function("spdk_log_set_level")
            .allowlist_var("SPDK_VERSION_(MAJOR|MINOR|PATCH|SUFFIX)")
            .allowlist_var("SPDK_RPC_(STARTUP|RUNTIME)")
            .allowlist_var("SPDK_ENV_NUMA_ID_ANY")
            .allowlist_type("spdk_bdev_io_wait_entry")
            // Packed and bitfield NVMe structures libclang cannot lay out, and
            // options sluice never fills: opaque blobs of the right size.
            .opaque_type("spdk_nvme_.*")
            .opaque_type("spdk_bdev_ext_io_opts")
            .opaque_type("spdk_memory_domain.*")
            .opaque_type("spdk_accel_.*")
            .derive_debug(true)
            .derive_default(true)
            .layout_tests(false)
            .generate_comments(false)
            .prepend_enum_name(false)
            .default_enum_style(bindgen::EnumVariation::Consts);
        if let Ok(target) = env::var("TARGET") {
            builder = builder.clang_arg(format!("--target={target}"));
        }
        builder
            .generate()
            .unwrap_or_else(|e| fail(&format!("bindgen on SPDK's headers failed: {e}")))
            .write_to_file(out.join("bindings.rs"))
            .expect("write bindings.rs");
    }

    fn fail(msg: &str) -> ! {
        eprintln!("spdk-sys: {msg}");
        panic!("spdk-sys: {msg}");
    }
}
