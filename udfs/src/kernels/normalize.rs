//! uint8 HWC → float32 CHW with per-channel mean and standard deviation.

use std::mem::MaybeUninit;

use crate::tensor::ImageRef;

/// `(x/255 - m)/s` for every byte value `x` of channel `ch`: `x * a + b`,
/// as a 256-entry table.
fn table(ch: usize, mean: &[f64], std: &[f64]) -> [f32; 256] {
    let m = mean[ch.min(mean.len() - 1)];
    let s = std[ch.min(std.len() - 1)];
    let (a, b) = (1.0 / (255.0 * s), -m / s);
    std::array::from_fn(|x| (x as f64 * a + b) as f32)
}

/// Per-channel `(x / 255 - mean) / std`, written planar (CHW) into `out`
/// (exactly the image's `c * h * w` elements; an RGB image is read in one
/// pass that writes its three planes). `mean` and `std` have one value per
/// channel (or one for all).
pub fn normalize_into(src: ImageRef<'_>, mean: &[f64], std: &[f64], out: &mut [f32]) {
    // SAFETY: `MaybeUninit<f32>` has `f32`'s layout, and `planes` only
    // writes initialised values through it, so `out` stays initialised.
    let out = unsafe { &mut *(std::ptr::from_mut(out) as *mut [MaybeUninit<f32>]) };
    planes(src, mean, std, out);
}

/// [`normalize_into`], appending the planes to `out` instead: nothing is
/// zeroed first (every element is written once, where it stays).
pub fn normalize_append(src: ImageRef<'_>, mean: &[f64], std: &[f64], out: &mut Vec<f32>) {
    let n = src.height as usize * src.width as usize * usize::from(src.channels);
    if n == 0 {
        return;
    }
    let start = out.len();
    out.reserve(n);
    planes(src, mean, std, &mut out.spare_capacity_mut()[..n]);
    // SAFETY: the `n` elements after `start` are within the capacity
    // reserved above and were each written by `planes`, which writes every
    // element of the slice it is given.
    unsafe { out.set_len(start + n) };
}

/// Writes every element of `out` (`c` planes of `h * w`): see
/// [`normalize_append`].
fn planes(src: ImageRef<'_>, mean: &[f64], std: &[f64], out: &mut [MaybeUninit<f32>]) {
    let c = usize::from(src.channels);
    let plane = src.height as usize * src.width as usize;
    assert_eq!(
        out.len(),
        plane * c,
        "normalize: an output of the wrong size"
    );
    if c == 0 || plane == 0 {
        return;
    }
    let pixels = &src.pixels[..plane * c];
    let luts: Vec<[f32; 256]> = (0..c).map(|ch| table(ch, mean, std)).collect();
    if c == 3 {
        let (r, rest) = out.split_at_mut(plane);
        let (g, b) = rest.split_at_mut(plane);
        let (px, _) = pixels.as_chunks::<3>();
        for (((r, g), b), p) in r.iter_mut().zip(g).zip(b).zip(px) {
            r.write(luts[0][usize::from(p[0])]);
            g.write(luts[1][usize::from(p[1])]);
            b.write(luts[2][usize::from(p[2])]);
        }
    } else {
        for (ch, dst) in out.chunks_exact_mut(plane).enumerate() {
            for (d, p) in dst.iter_mut().zip(pixels.chunks_exact(c)) {
                d.write(luts[ch][usize::from(p[ch])]);
            }
        }
    }
}

/// Checks mean/std against a channel count.
pub fn check_stats(mean: &[f64], std: &[f64], channels: u8) -> Result<(), String> {
    for (name, v) in [("mean", mean), ("std", std)] {
        if v.len() != 1 && v.len() != usize::from(channels) {
            return Err(format!(
                "{name} has {} values for an image of {channels} channels",
                v.len()
            ));
        }
    }
    if std.contains(&0.0) {
        return Err("std must not be zero".into());
    }
    if mean.iter().chain(std).any(|v| !v.is_finite()) {
        return Err("mean and std must be finite numbers (no NaN or infinity)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_must_be_finite_and_fit_the_channels() {
        assert!(check_stats(&[0.5], &[0.2], 3).is_ok());
        assert!(check_stats(&[f64::NAN], &[0.2], 3).is_err());
        assert!(check_stats(&[0.5], &[f64::INFINITY], 3).is_err());
        assert!(check_stats(&[0.5, 0.5], &[0.2], 3).is_err());
        assert!(check_stats(&[0.5], &[0.0], 3).is_err());
    }

    #[test]
    fn writes_planes_with_each_channels_statistics() {
        let px = [0, 255, 51, 255, 0, 102];
        let src = ImageRef {
            height: 1,
            width: 2,
            channels: 3,
            pixels: &px,
        };
        let mut out = [0f32; 6];
        normalize_into(src, &[0.0, 0.5, 0.0], &[1.0, 0.5, 0.2], &mut out);
        let want = [0.0, 1.0, 1.0, -1.0, 1.0, 2.0];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-6, "{out:?}");
        }
        let mut appended = vec![7.0];
        normalize_append(src, &[0.0, 0.5, 0.0], &[1.0, 0.5, 0.2], &mut appended);
        assert_eq!(appended[0], 7.0);
        assert_eq!(
            appended[1..],
            out,
            "appending writes what writing in place does"
        );
        let mut grey = [9f32; 2];
        let px = [0, 255];
        let one = ImageRef {
            channels: 1,
            pixels: &px,
            ..src
        };
        normalize_into(one, &[0.5], &[0.5], &mut grey);
        assert_eq!(grey, [-1.0, 1.0]);
        assert!(
            check_stats(&[0.5; 2], &[1.0], 3)
                .unwrap_err()
                .contains("mean has 2")
        );
    }

    #[test]
    fn appending_matches_writing_in_place_for_every_channel_count() {
        for c in 1..=4u8 {
            let (h, w) = (5u32, 7u32);
            let px: Vec<u8> = (0..h * w * u32::from(c))
                .map(|i| (i * 37 % 256) as u8)
                .collect();
            let src = ImageRef {
                height: h,
                width: w,
                channels: c,
                pixels: &px,
            };
            let (mean, std) = ([0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]);
            let mut want = vec![0f32; px.len()];
            normalize_into(src, &mean, &std, &mut want);
            let mut got = Vec::new();
            normalize_append(src, &mean, &std, &mut got);
            assert_eq!(got, want, "{c} channels");
        }
    }
}
