//! Fused decode + resize and decode + random resized crop, with JPEG
//! DCT-domain downscaling.
//!
//! [`crate::rewrite::SluiceRewrite`] turns `resize(decode_image(data), h, w)`
//! and `random_resized_crop(decode_image(data), h, w)` into these. They read
//! the header first, work out how many source pixels the output needs, and
//! let libjpeg-turbo run its IDCT at the smallest M/8 scale (M = 1, 2, 4, 8) that is
//! still at least the output's size: a 12 MP photo feeding a 224² crop of
//! half its area is decoded at about 0.2 MP. The random window is drawn exactly as
//! `random_resized_crop` draws it (same generator, same full-size
//! coordinates), so the two forms pick the same crop; the pixels differ only
//! by the DCT-domain prefilter (a few levels at most).

use arrow::array::ArrayRef;
use arrow::datatypes::FieldRef;
use datafusion::error::Result;

use super::random_resized_crop::{RRC_PARAMS, rrc_params};
use super::{Function, RandomResizedCrop};
use crate::args::{ArgSpec, Call, Consts, Kind, Lit, Param, opt, req};
use crate::cost::{Estimate, SampleStats};
use crate::kernels::decode::{Codec, Header, Mode, dct_scale, decode_at_least, header, scaled};
use crate::kernels::jpeg_window::decode_window as decode_jpeg_window;
use crate::kernels::resize::{Filter, Rect, resize_into};
use crate::tensor::{ImageBuilder, binary_value, expect_binary, image_field};

/// `decode_resize(data, h, w[, filter, mode])`.
#[derive(Debug, Default)]
pub struct DecodeResize;

/// `decode_random_resized_crop(data, h, w[, scale_min, scale_max, ratio_min, ratio_max, mode])`.
#[derive(Debug, Default)]
pub struct DecodeRandomResizedCrop;

const RRC_FUSED_PARAMS: [Param; 8] = [
    req("data", Kind::Value),
    RRC_PARAMS[1],
    RRC_PARAMS[2],
    RRC_PARAMS[3],
    RRC_PARAMS[4],
    RRC_PARAMS[5],
    RRC_PARAMS[6],
    opt("mode", Kind::Str, Lit::Str("RGB")),
];

/// What each row of a fused call becomes.
struct Target {
    h: u32,
    w: u32,
    mode: Mode,
    filter: Filter,
    limits: crate::env::Limits,
}

/// Decodes `bytes` (a `full`-sized image) no larger than `win` needs and
/// resamples `win` into `out` at the target size.
fn decode_window(
    bytes: &[u8],
    hd: &Header,
    win: Rect,
    t: &Target,
    out: &mut [u8],
) -> std::result::Result<(), String> {
    let (fw, fh) = (hd.width, hd.height);
    let (h, w, mode, limits) = (t.h, t.w, t.mode, &t.limits);
    let s = (win.width / f64::from(w))
        .min(win.height / f64::from(h))
        .max(1.0);
    if hd.codec == Codec::Turbo {
        let m = dct_scale(fw, fh, f64::from(fw) / s, f64::from(fh) / s);
        let (sw, sh) = scaled(fw, fh, m);
        let rect = inside(
            win,
            f64::from(fw) / f64::from(sw),
            f64::from(fh) / f64::from(sh),
            sw,
            sh,
        );
        // The resampling filter reads up to two source pixels beyond the
        // rectangle (bilinear support times a scale below 2), and libjpeg's
        // upsampling blends the window's outermost pixels: decode a margin.
        let x0 = (rect.left.floor() - WINDOW_MARGIN).max(0.0) as u32;
        let y0 = (rect.top.floor() - WINDOW_MARGIN).max(0.0) as u32;
        let x1 = ((rect.left + rect.width).ceil() + WINDOW_MARGIN).min(f64::from(sw)) as u32;
        let y1 = ((rect.top + rect.height).ceil() + WINDOW_MARGIN).min(f64::from(sh)) as u32;
        if (x1 - x0) * (y1 - y0) < sw * sh {
            let part = decode_jpeg_window(bytes, mode, m, sw, (x0, y0, x1 - x0, y1 - y0))?;
            let local = Rect {
                left: rect.left - f64::from(part.left),
                top: rect.top - f64::from(part.top),
                ..rect
            };
            return resize_into(part.image.view(), Some(local), h, w, t.filter, out);
        }
    }
    let scaled = decode_at_least(
        bytes,
        mode,
        hd,
        f64::from(fw) / s,
        f64::from(fh) / s,
        limits,
    )?;
    let img = &scaled.image;
    let rect = inside(win, scaled.factor_x, scaled.factor_y, img.width, img.height);
    let full = rect.left == 0.0
        && rect.top == 0.0
        && rect.width == f64::from(img.width)
        && rect.height == f64::from(img.height);
    resize_into(img.view(), (!full).then_some(rect), h, w, t.filter, out)
}

/// Pixels decoded around a JPEG window beyond what it covers.
const WINDOW_MARGIN: f64 = 4.0;

/// `win` (full-size coordinates) in an `iw`×`ih` image decoded with its
/// sides divided by `fx` and `fy`. The scaled size is rounded up by
/// libjpeg-turbo, so the window mapped into it can overhang by a fraction
/// of a pixel: it is kept inside.
fn inside(win: Rect, fx: f64, fy: f64, iw: u32, ih: u32) -> Rect {
    let (iw, ih) = (f64::from(iw), f64::from(ih));
    let width = (win.width / fx).min(iw);
    let height = (win.height / fy).min(ih);
    Rect {
        left: (win.left / fx).min(iw - width).max(0.0),
        top: (win.top / fy).min(ih - height).max(0.0),
        width,
        height,
    }
}

/// Decodes each row and writes an `h`×`w` image resampled from the window
/// `window` picks (in full-size coordinates) for that row.
fn decode_windows(
    call: &Call<'_>,
    mode: Mode,
    filter: Filter,
    mut window: impl FnMut(usize, u32, u32) -> Result<Rect>,
) -> Result<ArrayRef> {
    let (h, w) = (call.consts.size(1)?, call.consts.size(2)?);
    let data = call.array(0)?;
    let limits = call.limits();
    let c = mode.channels();
    let target = Target {
        h,
        w,
        mode,
        filter,
        limits,
    };
    let mut out = ImageBuilder::with_capacity(call.rows, (h * w) as usize * usize::from(c));
    for row in 0..call.rows {
        call.live()?;
        let Some(bytes) = binary_value(&data, row) else {
            out.append_null();
            continue;
        };
        let result = match header(bytes, mode, &target.limits) {
            Ok(hd) => {
                // A window that cannot be drawn (no hidden arguments) fails
                // the query; it is not a property of the sample.
                let win = window(row, hd.height, hd.width)?;
                out.try_append_with(h, w, c, |dst| decode_window(bytes, &hd, win, &target, dst))
            }
            Err(reason) => Err(reason),
        };
        if let Err(reason) = result {
            call.bad(row, reason)?;
            out.append_null();
        }
    }
    Ok(out.finish())
}

/// Work of a scaled decode, in full-decode-equivalent source pixels, for an
/// output of `out_px` pixels taken from a window of `window_px` pixels of a
/// `src_px` image. DCT scaling picks the smallest M/8 (M = 1, 2, 4, 8) that keeps the window
/// at least as large as the output; entropy decoding (about half of a full
/// decode with libjpeg-turbo) still reads every coefficient, while the IDCT,
/// upsampling and colour conversion run only on the window (a windowed
/// decode) and shrink with the square of the scale.
fn decoded_pixels(src_px: f64, window_px: f64, out_px: f64) -> f64 {
    let scale = [0.125, 0.25, 0.5]
        .into_iter()
        .find(|s| window_px * s * s >= out_px)
        .unwrap_or(1.0);
    0.5 * src_px + 0.5 * window_px * scale * scale
}

impl Function for DecodeResize {
    const SPEC: ArgSpec = ArgSpec {
        name: "decode_resize",
        params: &[
            req("data", Kind::Value),
            req("h", Kind::Int),
            req("w", Kind::Int),
            opt("filter", Kind::Str, Lit::Str("bilinear")),
            opt("mode", Kind::Str, Lit::Str("RGB")),
        ],
        random: false,
        keyed: true,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        expect_binary(Self::SPEC.name, &fields[0])?;
        consts.parsed(3, Filter::parse)?;
        let c = consts.parsed(4, Mode::parse)?.channels();
        Ok(image_field(
            Self::SPEC.name,
            [
                Some(consts.size(1)?),
                Some(consts.size(2)?),
                Some(u32::from(c)),
            ],
        ))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let filter = call.consts.parsed(3, Filter::parse)?;
        let mode = call.consts.parsed(4, Mode::parse)?;
        decode_windows(call, mode, filter, |_, fh, fw| {
            Ok(Rect {
                left: 0.0,
                top: 0.0,
                width: f64::from(fw),
                height: f64::from(fh),
            })
        })
    }

    fn cost(&self, consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        let (h, w) = (f64::from(consts.size(1)?), f64::from(consts.size(2)?));
        let c = f64::from(consts.parsed(4, Mode::parse)?.channels());
        Ok(Estimate {
            work: decoded_pixels(input.pixels(), input.pixels(), h * w),
            out: SampleStats::image(w, h, c),
        })
    }
}

impl Function for DecodeRandomResizedCrop {
    const SPEC: ArgSpec = ArgSpec {
        name: "decode_random_resized_crop",
        params: &RRC_FUSED_PARAMS,
        random: true,
        keyed: true,
    };

    fn return_field(&self, consts: &Consts, fields: &[FieldRef]) -> Result<FieldRef> {
        expect_binary(Self::SPEC.name, &fields[0])?;
        rrc_params(consts)?;
        let c = consts.parsed(7, Mode::parse)?.channels();
        Ok(image_field(
            Self::SPEC.name,
            [
                Some(consts.size(1)?),
                Some(consts.size(2)?),
                Some(u32::from(c)),
            ],
        ))
    }

    fn invoke(&self, call: &Call<'_>) -> Result<ArrayRef> {
        let params = rrc_params(&call.consts)?;
        let mode = call.consts.parsed(7, Mode::parse)?;
        decode_windows(call, mode, Filter::Bilinear, |row, fh, fw| {
            let mut rng = call.rng_for(row, RandomResizedCrop::SPEC.name)?;
            Ok(params.window(&mut rng, fh, fw))
        })
    }

    fn cost(&self, consts: &Consts, input: &SampleStats) -> Result<Estimate> {
        let (h, w) = (f64::from(consts.size(1)?), f64::from(consts.size(2)?));
        let area = (consts.float(3)? + consts.float(4)?) / 2.0;
        let c = f64::from(consts.parsed(7, Mode::parse)?.channels());
        Ok(Estimate {
            work: decoded_pixels(input.pixels(), input.pixels() * area, h * w),
            out: SampleStats::image(w, h, c),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Limits;
    use crate::kernels::jpeg_window::tests::jpeg;

    #[test]
    fn a_windowed_decode_gives_the_pixels_of_a_whole_decode() {
        let bytes = jpeg(500, 375, turbojpeg::Subsamp::Sub2x2, false);
        let hd = header(&bytes, Mode::Rgb, &Limits::default()).unwrap();
        let t = Target {
            h: 224,
            w: 224,
            mode: Mode::Rgb,
            filter: Filter::Bilinear,
            limits: Limits::default(),
        };
        let windows = [
            (0.0, 0.0, 500.0, 375.0),
            (17.3, 40.9, 300.2, 200.7),
            (250.0, 100.0, 250.0, 275.0),
            (0.0, 200.5, 120.0, 174.5),
            (410.2, 3.0, 60.0, 80.0),
        ];
        for (left, top, width, height) in windows {
            let win = Rect {
                left,
                top,
                width,
                height,
            };
            let mut got = vec![0u8; 224 * 224 * 3];
            decode_window(&bytes, &hd, win, &t, &mut got).unwrap();
            // The reference: the whole image at the same DCT scale, then
            // the window resampled from it.
            let s = (width / 224.0).min(height / 224.0).max(1.0);
            let whole =
                decode_at_least(&bytes, Mode::Rgb, &hd, 500.0 / s, 375.0 / s, &t.limits).unwrap();
            let rect = inside(
                win,
                whole.factor_x,
                whole.factor_y,
                whole.image.width,
                whole.image.height,
            );
            let mut want = vec![0u8; 224 * 224 * 3];
            resize_into(
                whole.image.view(),
                Some(rect),
                224,
                224,
                t.filter,
                &mut want,
            )
            .unwrap();
            assert!(got == want, "window {win:?}");
        }
    }

    #[test]
    fn dct_scaling_shrinks_the_decode_only_when_the_output_allows() {
        let mp12 = 4000.0 * 3000.0;
        assert_eq!(
            decoded_pixels(mp12, mp12, 224.0 * 224.0),
            mp12 * (0.5 + 0.5 / 64.0)
        );
        let small = 500.0 * 375.0;
        assert_eq!(decoded_pixels(small, small, 224.0 * 224.0), small);
        // A window of a tenth of the image: its IDCT only.
        let tenth = decoded_pixels(small, small * 0.1, 224.0 * 224.0);
        assert!((tenth - small * 0.55).abs() < 1e-6, "{tenth}");
    }
}
