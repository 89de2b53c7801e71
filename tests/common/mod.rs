//! Shared helpers for end-to-end tests that run the real `sluice` binary.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A scratch data dir and the binary under test.
pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A `sluice` command with this env's data dir and a small device.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
        c.env("SLUICE_DATA_DIR", self.data_dir())
            .env("SLUICE_DEVICE_SIZE", "256MiB")
            .env("SLUICE_CHUNK_SIZE", "1MiB")
            .env_remove("SLUICE_LOG");
        c
    }

    /// Runs `sluice ARGS…` and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("run sluice")
    }

    /// Runs `sluice ARGS…`, asserts success, returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "sluice {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stdout).expect("utf-8 stdout")
    }

    /// Runs `sluice ARGS…`, asserts failure with a one-line error, returns it.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "sluice {args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("error: "))
            .collect();
        assert_eq!(errors.len(), 1, "expected one error line, got: {stderr}");
        errors[0].to_owned()
    }

    /// Runs `sluice ARGS…`, asserts success, parses stdout as one JSON document.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).expect("json document")
    }

    /// JSON lines from `sluice sql … --format json`.
    pub fn sql_json(&self, query: &str, extra: &[&str]) -> Vec<serde_json::Value> {
        let mut args = vec!["sql", query, "--format", "json"];
        args.extend_from_slice(extra);
        self.ok(&args)
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect()
    }
}

/// Writes an ImageFolder tree of `classes` × `per_class` images with the binary.
pub fn gen_sample(env: &Env, dir: &Path, classes: u32, per_class: u32, seed: u64) {
    env.ok(&[
        "gen-sample",
        dir.to_str().expect("utf-8 path"),
        "--classes",
        &classes.to_string(),
        "--per-class",
        &per_class.to_string(),
        "--seed",
        &seed.to_string(),
    ]);
}

/// Standard base64 decoding (for `--binary base64`).
pub fn unbase64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => 0,
        }
    };
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for chunk in bytes.chunks(4) {
        let n = chunk.iter().fold(0u32, |acc, &c| (acc << 6) | val(c));
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let b = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&b[..3 - pad]);
    }
    out
}
