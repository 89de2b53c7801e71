//! Image resampling with SIMD convolution (fast_image_resize).
//!
//! Filters are separable convolutions whose support grows with the
//! downscale factor, so downscaling is antialiased like Pillow's `resize`.
//! A crop rectangle (fractional) can be given, so that a crop followed by a
//! resize reads only the source pixels it needs and makes one output.

use std::cell::RefCell;

use fast_image_resize::images::{Image as FirImage, ImageRef as FirRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use crate::tensor::ImageRef;

/// A resampling filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// Nearest neighbour.
    Nearest,
    /// Bilinear (triangle), antialiased.
    Bilinear,
    /// Bicubic (Catmull-Rom), antialiased.
    Bicubic,
    /// Lanczos with 3 lobes, antialiased.
    Lanczos3,
}

impl Filter {
    /// Parses a filter name.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "nearest" => Ok(Self::Nearest),
            "bilinear" | "linear" => Ok(Self::Bilinear),
            "bicubic" | "cubic" => Ok(Self::Bicubic),
            "lanczos3" | "lanczos" => Ok(Self::Lanczos3),
            other => Err(format!(
                "unknown filter '{other}' (expected nearest, bilinear, bicubic or lanczos3)"
            )),
        }
    }

    fn alg(self) -> ResizeAlg {
        match self {
            Self::Nearest => ResizeAlg::Nearest,
            Self::Bilinear => ResizeAlg::Convolution(FilterType::Bilinear),
            Self::Bicubic => ResizeAlg::Convolution(FilterType::CatmullRom),
            Self::Lanczos3 => ResizeAlg::Convolution(FilterType::Lanczos3),
        }
    }
}

/// A source rectangle: left, top, width, height (may be fractional).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rect {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
}

fn pixel_type(channels: u8) -> Result<PixelType, String> {
    match channels {
        1 => Ok(PixelType::U8),
        2 => Ok(PixelType::U8x2),
        3 => Ok(PixelType::U8x3),
        4 => Ok(PixelType::U8x4),
        c => Err(format!("cannot resize an image of {c} channels")),
    }
}

thread_local! {
    static RESIZER: RefCell<Resizer> = RefCell::new(Resizer::new());
}

/// Resamples `src` (or its `crop`) to `w`×`h` into `out` (`h * w * channels` bytes).
pub fn resize_into(
    src: ImageRef<'_>,
    crop: Option<Rect>,
    h: u32,
    w: u32,
    filter: Filter,
    out: &mut [u8],
) -> Result<(), String> {
    let pt = pixel_type(src.channels)?;
    if src.width == 0 || src.height == 0 {
        return Err(format!(
            "cannot resize an empty {}x{} image",
            src.width, src.height
        ));
    }
    if crop.is_none() && src.width == w && src.height == h {
        out.copy_from_slice(src.pixels);
        return Ok(());
    }
    let src_img = FirRef::new(src.width, src.height, src.pixels, pt).map_err(|e| e.to_string())?;
    let mut dst = FirImage::from_slice_u8(w, h, out, pt).map_err(|e| e.to_string())?;
    let mut options = ResizeOptions::new()
        .resize_alg(filter.alg())
        .use_alpha(false);
    if let Some(r) = crop {
        let (left, width) = fit(r.left, r.width, src.width)?;
        let (top, height) = fit(r.top, r.height, src.height)?;
        options = options.crop(left, top, width, height);
    }
    RESIZER
        .with(|r| r.borrow_mut().resize(&src_img, &mut dst, &options))
        .map_err(|e| e.to_string())
}

/// The span `left..left + width` of a crop, kept inside a side of `side`
/// pixels as fast_image_resize checks it (`left + width <= side` in f64).
/// Windows computed in another image's coordinates and shifted
/// (`rect.left - part.left`) can overhang by a rounding error: one in 25
/// right-edge windows did, which failed a sample under `fail` one epoch in
/// a few hundred. An overhang beyond rounding is a bug, and an error.
fn fit(left: f64, width: f64, side: u32) -> Result<(f64, f64), String> {
    let side = f64::from(side);
    if !(left > -1e-6 && width > 0.0 && left + width <= side + 1e-6 * side.max(1.0)) {
        return Err(format!(
            "crop {width} px from {left} does not lie in a side of {side} px"
        ));
    }
    let left = left.clamp(0.0, side);
    let mut width = width.min(side - left);
    while left + width > side {
        width = f64::from_bits(width.to_bits() - 1);
    }
    if width <= 0.0 {
        return Err(format!("empty crop at {left} of a side of {side} px"));
    }
    Ok((left, width))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(w: u32, h: u32, c: u8, f: impl Fn(u32, u32, u8) -> u8) -> Vec<u8> {
        let mut v = Vec::new();
        for y in 0..h {
            for x in 0..w {
                for k in 0..c {
                    v.push(f(x, y, k));
                }
            }
        }
        v
    }

    #[test]
    fn a_crop_overhanging_by_a_rounding_error_is_kept_inside() {
        // Found by a 10-minute load run: a right-edge window shifted into a
        // decoded part's coordinates ended at 194.00000000000003 of 194.
        let (left, width) = (320.80807287709945 - 277.0, 150.19192712290058);
        assert!(left + width > 194.0);
        let (l, w) = fit(left, width, 194).unwrap();
        assert!(l + w <= 194.0 && (w - width).abs() < 1e-9);
        let src = img(194, 3, 3, |x, y, k| (x + y) as u8 ^ k);
        let mut out = vec![0; 8 * 2 * 3];
        let crop = Rect {
            left,
            top: 0.0,
            width,
            height: 3.0,
        };
        let view = ImageRef {
            height: 3,
            width: 194,
            channels: 3,
            pixels: &src,
        };
        resize_into(view, Some(crop), 2, 8, Filter::Bilinear, &mut out).unwrap();
        assert!(fit(190.0, 8.0, 194).unwrap_err().contains("does not lie"));
        assert!(fit(-3.0, 8.0, 194).is_err());
    }

    #[test]
    fn a_flat_image_stays_flat_and_a_gradient_keeps_its_mean() {
        let px = img(64, 48, 3, |_, _, k| 10 * (k + 1));
        let src = ImageRef {
            height: 48,
            width: 64,
            channels: 3,
            pixels: &px,
        };
        for filter in [
            Filter::Nearest,
            Filter::Bilinear,
            Filter::Bicubic,
            Filter::Lanczos3,
        ] {
            let mut out = vec![0; 16 * 20 * 3];
            resize_into(src, None, 16, 20, filter, &mut out).unwrap();
            assert!(out.chunks(3).all(|p| p == [10, 20, 30]), "{filter:?}");
        }
        let px = img(100, 10, 1, |x, _, _| (x * 2) as u8);
        let src = ImageRef {
            height: 10,
            width: 100,
            channels: 1,
            pixels: &px,
        };
        let mut out = vec![0; 10 * 10];
        resize_into(src, None, 10, 10, Filter::Bilinear, &mut out).unwrap();
        let mean = out.iter().map(|&v| f64::from(v)).sum::<f64>() / 100.0;
        assert!((mean - 99.0).abs() < 2.0, "{mean}");
        assert!(out[0] < out[9]);
    }

    #[test]
    fn a_crop_resamples_only_its_rectangle() {
        let px = img(40, 40, 1, |x, _, _| if x < 20 { 0 } else { 200 });
        let src = ImageRef {
            height: 40,
            width: 40,
            channels: 1,
            pixels: &px,
        };
        let mut out = vec![0; 8 * 8];
        let r = Rect {
            left: 22.0,
            top: 0.0,
            width: 16.0,
            height: 16.0,
        };
        resize_into(src, Some(r), 8, 8, Filter::Bilinear, &mut out).unwrap();
        assert!(out.iter().all(|&v| v == 200));
    }

    #[test]
    fn names_parse() {
        assert_eq!(Filter::parse("BILINEAR").unwrap(), Filter::Bilinear);
        assert!(Filter::parse("box").unwrap_err().contains("'box'"));
    }
}
