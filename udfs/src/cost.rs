//! Cost profiles: CPU time and result size of each UDF, from sample statistics.
//!
//! Each UDF reports, for one sample described by [`SampleStats`], its work
//! in its own unit (source pixels decoded, output pixels resampled, bytes
//! copied …) and the statistics of its result. A [`Profile`] per UDF turns
//! work into nanoseconds: `ns = per_call + per_unit × work`. The defaults
//! were measured by [`crate::calibrate::calibrate`] on a 2-core x86-64 VM (AVX2) in the dev
//! profile's optimisation of the kernels; `sluice udfs --calibrate` measures
//! them on the machine at hand and saves them for the planner.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Per-sample statistics of a value: an object, image, clip or array.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct SampleStats {
    /// Bytes of the value (encoded size for objects, decoded size otherwise).
    pub bytes: f64,
    /// Width in pixels (images, frames; last volume axis for arrays).
    pub width: f64,
    /// Height in pixels.
    pub height: f64,
    /// Channels.
    pub channels: f64,
    /// Frames (1 for images).
    pub frames: f64,
    /// Elements of an array.
    pub elements: f64,
}

impl SampleStats {
    /// An encoded image of `bytes` with the given size.
    pub fn encoded_image(bytes: f64, width: f64, height: f64, channels: f64) -> Self {
        Self {
            bytes,
            width,
            height,
            channels,
            frames: 1.0,
            elements: 0.0,
        }
    }

    /// A decoded image.
    pub fn image(width: f64, height: f64, channels: f64) -> Self {
        Self {
            bytes: width * height * channels,
            width,
            height,
            channels,
            frames: 1.0,
            elements: width * height * channels,
        }
    }

    /// Pixels per frame.
    pub fn pixels(&self) -> f64 {
        self.width * self.height
    }
}

/// One call's work and result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Work, in the UDF's unit.
    pub work: f64,
    /// Statistics of the result.
    pub out: SampleStats,
}

/// Turns work into time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Fixed cost of a call, in ns.
    pub per_call_ns: f64,
    /// Cost per unit of work, in ns.
    pub per_unit_ns: f64,
    /// What a unit is.
    pub unit: String,
}

impl Profile {
    /// Nanoseconds for `work` units.
    pub fn ns(&self, work: f64) -> f64 {
        self.per_call_ns + self.per_unit_ns * work
    }
}

/// Profiles by UDF name.
pub type Profiles = BTreeMap<String, Profile>;

/// The default profiles (see the module docs for where they come from).
pub fn default_profiles() -> Profiles {
    // (udf, ns per call, ns per unit, unit)
    const DEFAULTS: &[(&str, f64, f64, &str)] = &[
        ("decode_image", 56_000.0, 5.3, "source pixel"),
        ("decode_resize", 560_000.0, 5.2, "effective source pixel"),
        (
            "decode_random_resized_crop",
            510_000.0,
            6.1,
            "effective source pixel",
        ),
        ("resize", 181_000.0, 0.72, "source + output pixel"),
        ("center_crop", 0.0, 0.23, "output byte"),
        (
            "random_resized_crop",
            179_000.0,
            0.58,
            "source + output pixel",
        ),
        ("random_horizontal_flip", 0.0, 0.96, "output byte"),
        ("normalize", 0.0, 2.4, "element"),
        ("to_tensor", 0.0, 0.11, "byte"),
        ("decode_video", 501_000.0, 1.6, "decoded frame pixel"),
        ("npy", 0.0, 0.75, "byte"),
        ("npz", 0.0, 0.35, "byte"),
        ("crop3d", 120.0, 0.12, "output byte"),
        ("resize3d", 370.0, 25.9, "output element"),
    ];
    DEFAULTS
        .iter()
        .map(|&(n, c, u, unit)| {
            (
                n.to_owned(),
                Profile {
                    per_call_ns: c,
                    per_unit_ns: u,
                    unit: unit.to_owned(),
                },
            )
        })
        .collect()
}

/// The file in a data dir where `sluice udfs --calibrate` keeps its profiles.
pub const PROFILES_FILE: &str = "udf-profiles.json";

/// The defaults, overridden by the profiles saved at `path` (if it exists).
pub fn load_profiles(path: &std::path::Path) -> Result<Profiles, String> {
    let mut profiles = default_profiles();
    match std::fs::read(path) {
        Ok(bytes) => {
            let saved: Profiles = serde_json::from_slice(&bytes)
                .map_err(|e| format!("bad profiles file {}: {e}", path.display()))?;
            profiles.extend(saved);
            Ok(profiles)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(profiles),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Fits `ns = per_call + per_unit × work` through two measurements.
pub fn fit(unit: &str, small: (f64, f64), large: (f64, f64)) -> Profile {
    let (w0, t0) = small;
    let (w1, t1) = large;
    let per_unit = if w1 > w0 {
        ((t1 - t0) / (w1 - w0)).max(0.0)
    } else {
        0.0
    };
    Profile {
        per_call_ns: (t0 - per_unit * w0).max(0.0),
        per_unit_ns: per_unit,
        unit: unit.to_owned(),
    }
}

/// Median nanoseconds of `f` over `runs` runs (after one warm-up run).
pub fn median_ns(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_line_and_never_goes_negative() {
        let p = fit("px", (100.0, 1_100.0), (1_000.0, 10_100.0));
        assert!((p.per_unit_ns - 10.0).abs() < 1e-9 && (p.per_call_ns - 100.0).abs() < 1e-9);
        let flat = fit("px", (100.0, 500.0), (1_000.0, 400.0));
        assert_eq!(flat.per_unit_ns, 0.0);
        assert!(default_profiles().len() >= 14);
    }
}
