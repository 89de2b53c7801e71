//! Crops: centre crops with zero padding, and torchvision's random resized crop.

use crate::kernels::resize::Rect;
use crate::random::SampleRng;
use crate::tensor::ImageRef;

/// Copies the `h`×`w` window whose top-left corner is (`top`, `left`) of
/// `src` into `out`; parts of the window outside the image are zero.
pub fn crop_into(src: ImageRef<'_>, top: i64, left: i64, h: u32, w: u32, out: &mut [u8]) {
    let c = usize::from(src.channels);
    let (sw, sh) = (i64::from(src.width), i64::from(src.height));
    out.fill(0);
    let x0 = left.max(0);
    let x1 = (left + i64::from(w)).min(sw);
    if x1 <= x0 {
        return;
    }
    let span = (x1 - x0) as usize * c;
    for y in 0..i64::from(h) {
        let sy = top + y;
        if !(0..sh).contains(&sy) {
            continue;
        }
        let s = ((sy * sw + x0) as usize) * c;
        let d = ((y as usize * w as usize) + (x0 - left) as usize) * c;
        out[d..d + span].copy_from_slice(&src.pixels[s..s + span]);
    }
}

/// The top-left corner of a centred `h`×`w` window (negative when the image is smaller).
pub fn center_offsets(src_h: u32, src_w: u32, h: u32, w: u32) -> (i64, i64) {
    let off = |s: u32, d: u32| ((f64::from(s) - f64::from(d)) / 2.0).round() as i64;
    (off(src_h, h), off(src_w, w))
}

/// Parameters of a random resized crop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RrcParams {
    /// Area range, as fractions of the image.
    pub scale: (f64, f64),
    /// Aspect ratio (w/h) range.
    pub ratio: (f64, f64),
}

impl Default for RrcParams {
    fn default() -> Self {
        Self {
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
        }
    }
}

impl RrcParams {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), String> {
        let (s0, s1) = self.scale;
        let (r0, r1) = self.ratio;
        if !(0.0 < s0 && s0 <= s1 && s1 <= 1.0) {
            return Err(format!(
                "scale must satisfy 0 < min <= max <= 1, got ({s0}, {s1})"
            ));
        }
        if !(0.0 < r0 && r0 <= r1) {
            return Err(format!(
                "ratio must satisfy 0 < min <= max, got ({r0}, {r1})"
            ));
        }
        Ok(())
    }

    /// The crop window for an `h`×`w` image: torchvision's algorithm (ten
    /// tries of a random area and log-uniform aspect ratio, then a centre
    /// crop clamped to the ratio range).
    pub fn window(&self, rng: &mut SampleRng, h: u32, w: u32) -> Rect {
        let (fh, fw) = (f64::from(h), f64::from(w));
        let area = fh * fw;
        let (lr0, lr1) = (self.ratio.0.ln(), self.ratio.1.ln());
        for _ in 0..10 {
            let target = area * rng.uniform(self.scale.0, self.scale.1);
            let aspect = rng.uniform(lr0, lr1).exp();
            let cw = (target * aspect).sqrt().round();
            let ch = (target / aspect).sqrt().round();
            if cw > 0.0 && ch > 0.0 && cw <= fw && ch <= fh {
                let top = rng.below_or_eq((fh - ch) as u32);
                let left = rng.below_or_eq((fw - cw) as u32);
                return Rect {
                    left: f64::from(left),
                    top: f64::from(top),
                    width: cw,
                    height: ch,
                };
            }
        }
        let in_ratio = fw / fh;
        let (cw, ch) = if in_ratio < self.ratio.0 {
            (fw, (fw / self.ratio.0).round())
        } else if in_ratio > self.ratio.1 {
            ((fh * self.ratio.1).round(), fh)
        } else {
            (fw, fh)
        };
        Rect {
            left: ((fw - cw) / 2.0).floor(),
            top: ((fh - ch) / 2.0).floor(),
            width: cw,
            height: ch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn center_crop_pads_with_zeros_when_the_image_is_smaller() {
        let px: Vec<u8> = (1..=4).collect();
        let src = ImageRef {
            height: 2,
            width: 2,
            channels: 1,
            pixels: &px,
        };
        let (t, l) = center_offsets(2, 2, 4, 4);
        let mut out = vec![9; 16];
        crop_into(src, t, l, 4, 4, &mut out);
        assert_eq!(out, [0, 0, 0, 0, 0, 1, 2, 0, 0, 3, 4, 0, 0, 0, 0, 0]);
        let (t, l) = center_offsets(2, 2, 1, 1);
        let mut one = [0];
        crop_into(src, t, l, 1, 1, &mut one);
        assert_eq!(one, [4]);
    }

    proptest! {
        #[test]
        fn windows_lie_inside_the_image(h in 1u32..3000, w in 1u32..3000, seed: u64) {
            let mut rng = SampleRng::new(seed, 0, "k", "rrc");
            let r = RrcParams::default().window(&mut rng, h, w);
            prop_assert!(r.left >= 0.0 && r.top >= 0.0 && r.width >= 1.0 && r.height >= 1.0);
            prop_assert!(r.left + r.width <= f64::from(w) && r.top + r.height <= f64::from(h));
        }
    }
}
