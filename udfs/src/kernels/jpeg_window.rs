//! Windowed JPEG decoding: only the rows and iMCU columns a crop needs, at
//! M/8 DCT scale.
//!
//! A random resized crop keeps on average about half of an image. Rows
//! above the window are skipped and rows below it entropy-decoded without
//! their inverse DCT (libjpeg's `jpeg_skip_scanlines`), and columns left
//! and right of it are never upsampled or colour-converted
//! (`jpeg_crop_scanline`, which widens the window to the iMCU grid): the
//! technique behind tf.data's `decode_and_crop_jpeg`, on top of the DCT
//! scaling of [`super::decode::decode_at_least`]. Pixels inside the window
//! are those of a full decode at the same scale, and a truncated or corrupt
//! file is refused as a full decode refuses it (every entropy-coded row is
//! still read). The libjpeg calls live in `csrc/jpeg_window.c`, which keeps
//! libjpeg's `setjmp`/`longjmp` error handling on the C side.

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulong};

use super::decode::{Mode, tolerable_warning};
use crate::tensor::Image;

unsafe extern "C" {
    fn sluice_jpeg_window(
        data: *const u8,
        size: c_ulong,
        components: c_int,
        scale_num: c_uint,
        left: c_uint,
        top: c_uint,
        width: c_uint,
        height: c_uint,
        out: *mut u8,
        out_size: c_ulong,
        out_left: *mut c_uint,
        out_width: *mut c_uint,
        message: *mut c_char,
        message_size: c_ulong,
    ) -> c_int;
}

/// A decoded window and where it sits in the scaled image.
#[derive(Debug)]
pub struct Window {
    /// The pixels: the rows asked for, the columns widened to the iMCU grid.
    pub image: Image,
    /// Column of the scaled image where `image` starts.
    pub left: u32,
    /// Row of the scaled image where `image` starts.
    pub top: u32,
}

/// Decodes the `width`×`height` window at (`left`, `top`) of the JPEG
/// `bytes` decoded at `m`/8 scale, whose scaled width is `scaled_width`
/// (coordinates are in scaled pixels; the window must lie inside).
pub fn decode_window(
    bytes: &[u8],
    mode: Mode,
    m: u32,
    scaled_width: u32,
    (left, top, width, height): (u32, u32, u32, u32),
) -> Result<Window, String> {
    let c = usize::from(mode.channels());
    // The iMCU-widened window is never wider than the scaled image. Not
    // zeroed: libjpeg writes every byte that is kept.
    let mut pixels: Vec<u8> = Vec::with_capacity(scaled_width as usize * height as usize * c);
    let mut message = [0 as c_char; 256];
    let (mut out_left, mut out_width) = (0, 0);
    // SAFETY: `bytes` is a live slice passed with its length, and
    // `pixels` a live allocation of `capacity()` bytes passed with that
    // size; the C side writes at most that many (it checks the widened
    // window against `out_size` before writing),
    // NUL-terminates within `message.len()` bytes (snprintf), and keeps no
    // pointer after it returns. libjpeg's longjmp never leaves the C
    // function, so no Rust frame is skipped.
    let rc = unsafe {
        sluice_jpeg_window(
            bytes.as_ptr(),
            bytes.len() as c_ulong,
            c as c_int,
            m,
            left,
            top,
            width,
            height,
            pixels.as_mut_ptr(),
            pixels.capacity() as c_ulong,
            &mut out_left,
            &mut out_width,
            message.as_mut_ptr(),
            message.len() as c_ulong,
        )
    };
    // SAFETY: the C side always NUL-terminates `message` (it is zeroed
    // first and only written by snprintf within its size).
    let text = unsafe { CStr::from_ptr(message.as_ptr()) }.to_string_lossy();
    match rc {
        0 => {}
        // libjpeg decoded every scanline and only warned: tolerated as the
        // full decode tolerates it.
        1 if tolerable_warning(&text) => {}
        _ => return Err(format!("cannot decode JPEG: {text}")),
    }
    let len = out_width as usize * height as usize * c;
    assert!(
        len <= pixels.capacity(),
        "libjpeg widened the window past the buffer"
    );
    // SAFETY: on success the C side has read `height` scanlines of
    // `out_width` pixels of `c` bytes into the buffer, one after the
    // other: its first `len` bytes are initialised, and `len` is within
    // the capacity (checked above).
    unsafe { pixels.set_len(len) };
    Ok(Window {
        image: Image {
            height,
            width: out_width,
            channels: c as u8,
            pixels,
        },
        left: out_left,
        top,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::env::Limits;
    use crate::kernels::decode::{decode_at_least, header, scaled};

    /// A JPEG of a `w`×`h` pattern, with the chroma subsampling asked for,
    /// baseline or progressive.
    pub(crate) fn jpeg(w: u32, h: u32, subsamp: turbojpeg::Subsamp, progressive: bool) -> Vec<u8> {
        let pixels: Vec<u8> = (0..w * h)
            .flat_map(|i| {
                let (x, y) = (i % w, i / w);
                [(x * 7 + y) as u8, ((y * 3) ^ x) as u8, ((x * y) >> 3) as u8]
            })
            .collect();
        let img = turbojpeg::Image {
            pixels: pixels.as_slice(),
            width: w as usize,
            pitch: w as usize * 3,
            height: h as usize,
            format: turbojpeg::PixelFormat::RGB,
        };
        let mut c = turbojpeg::Compressor::new().unwrap();
        c.set_quality(90);
        c.set_subsamp(subsamp);
        if progressive {
            // TurboJPEG 2 has no progressive switch: re-encode losslessly.
            let baseline = c.compress_to_vec(img).unwrap();
            let mut t = turbojpeg::Transformer::new().unwrap();
            let tf = turbojpeg::Transform {
                progressive: true,
                ..Default::default()
            };
            return t.transform_to_vec(&tf, &baseline).unwrap();
        }
        c.compress_to_vec(img).unwrap()
    }

    #[test]
    fn a_window_is_the_same_pixels_as_the_full_decode_at_that_scale() {
        for (subsamp, progressive) in [
            (turbojpeg::Subsamp::Sub2x2, false),
            (turbojpeg::Subsamp::None, false),
            (turbojpeg::Subsamp::Sub2x1, true),
        ] {
            let bytes = jpeg(333, 250, subsamp, progressive);
            let hd = header(&bytes, Mode::Rgb, &Limits::default()).unwrap();
            for m in [8, 4, 2, 1] {
                let (sw, sh) = scaled(333, 250, m);
                let full = decode_at_least(
                    &bytes,
                    Mode::Rgb,
                    &hd,
                    f64::from(sw),
                    f64::from(sh),
                    &Limits::default(),
                )
                .unwrap()
                .image;
                assert_eq!((full.width, full.height), (sw, sh));
                let (l, t, w, h) = (sw / 3, sh / 4, sw / 2, sh / 3);
                let win = decode_window(&bytes, Mode::Rgb, m, sw, (l, t, w, h)).unwrap();
                assert!(win.left <= l && win.left + win.image.width >= l + w);
                assert_eq!((win.top, win.image.height), (t, h));
                // Rows and columns away from the window's edges match the
                // full decode exactly (libjpeg's fancy upsampling blends
                // across the iMCU edge it crops at).
                let mut worst = 0u8;
                for y in 1..h - 1 {
                    for x in l + 1..l + w - 1 {
                        for ch in 0..3 {
                            let a = full.pixels[(((t + y) * sw + x) * 3 + ch) as usize];
                            let b = win.image.pixels
                                [((y * win.image.width + x - win.left) * 3 + ch) as usize];
                            worst = worst.max(a.abs_diff(b));
                        }
                    }
                }
                assert_eq!(worst, 0, "{subsamp:?} progressive={progressive} m={m}");
            }
        }
    }

    #[test]
    fn a_file_cut_below_the_window_is_refused_like_a_full_decode() {
        let bytes = jpeg(320, 240, turbojpeg::Subsamp::Sub2x2, false);
        let cut = &bytes[..bytes.len() * 2 / 3];
        let err = decode_window(cut, Mode::Rgb, 8, 320, (0, 0, 100, 40)).unwrap_err();
        assert!(err.contains("Premature end"), "{err}");
        assert!(decode_window(&bytes, Mode::Rgb, 8, 320, (0, 0, 100, 40)).is_ok());
    }

    #[test]
    fn windows_outside_the_image_and_garbage_are_errors() {
        let bytes = jpeg(64, 48, turbojpeg::Subsamp::Sub2x2, false);
        let err = decode_window(&bytes, Mode::Rgb, 8, 64, (60, 0, 10, 10)).unwrap_err();
        assert!(err.contains("outside"), "{err}");
        let err =
            decode_window(b"\xff\xd8\xffnot a jpeg", Mode::Rgb, 8, 64, (0, 0, 1, 1)).unwrap_err();
        assert!(err.starts_with("cannot decode JPEG"), "{err}");
        for mode in [Mode::L, Mode::Rgba] {
            let win = decode_window(&bytes, mode, 4, 32, (0, 0, 32, 24)).unwrap();
            assert_eq!(
                win.image.pixels.len(),
                32 * 24 * usize::from(mode.channels())
            );
        }
    }
}
