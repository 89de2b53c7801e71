//! AVIF still images, read by FFmpeg (the same libavformat/libavcodec the
//! video path links).
//!
//! libavformat's ISOBMFF demuxer finds the primary item and libavcodec
//! decodes it with libdav1d. The YUV→RGB conversion uses the file's own
//! matrix and range (swscale, accurate rounding, full chroma
//! interpolation). Pixels differ from libavif's (the library Pillow uses)
//! where the two upsample chroma differently: over Pillow's AVIF test
//! files, by under 1 level on average and at most 8 at the 99th
//! percentile (`scripts/survey_decode.py`). FFmpeg 5.1 reads neither the
//! alpha auxiliary item nor the `irot`/`imir` transforms: alpha is
//! opaque, and the pixels are as stored, which is also what Pillow
//! returns before an `exif_transpose`.
//!
//! FFmpeg also reads GIF, BMP and ICO, but not as Pillow does where the
//! `image` crate refuses them (a GIF without a palette is black to it, an
//! ICO's PNG entry has no size until decoded): those have modules of
//! their own beside `decode`.
//!
//! The object is read from memory through a custom AVIO context; the
//! largest video stream's first frame is decoded and converted to RGBA.
//! Its size is checked against the caller's limits before any frame is
//! decoded, and the decode loop stops at the limits' time. (The largest
//! stream is taken so that a container of several images gives its main
//! one.)

use std::io::Cursor;
use std::time::Instant;

use ffmpeg_next as ff;
use image::{DynamicImage, RgbaImage};

use super::video;
use crate::env::Limits;

/// The first frame of the largest video stream of `bytes`, as RGBA.
/// `check` refuses a size before any frame is decoded.
pub fn decode(
    bytes: &[u8],
    limits: &Limits,
    check: impl FnOnce(u32, u32) -> Result<(), String>,
) -> Result<DynamicImage, String> {
    let mut input = open(bytes)?;
    let format = input.format().name().to_owned();
    let (index, mut dec) = largest_stream(&input)?;
    let (w, h) = (dec.width(), dec.height());
    if w == 0 || h == 0 {
        return Err(format!("{format}: the image has no size"));
    }
    check(w, h)?;
    let started = Instant::now();
    let mut frame = ff::frame::Video::empty();
    let mut got = false;
    for (s, packet) in input.packets() {
        if s.index() != index {
            continue;
        }
        limits.check_time(started, || format!("decoding a {format} image"))?;
        if dec.send_packet(&packet).is_err() {
            continue;
        }
        if dec.receive_frame(&mut frame).is_ok() {
            got = true;
            break;
        }
    }
    if !got {
        let _ = dec.send_eof();
        got = dec.receive_frame(&mut frame).is_ok();
    }
    if !got {
        return Err(format!("FFmpeg decoded no image from this {format} file"));
    }
    rgba(&frame).map_err(|e| format!("{format}: {e}"))
}

/// The size of the image [`decode`] would return.
pub fn header(bytes: &[u8]) -> Result<(String, u32, u32), String> {
    let input = open(bytes)?;
    let (_, dec) = largest_stream(&input)?;
    Ok((input.format().name().to_owned(), dec.width(), dec.height()))
}

/// The container of `bytes`, read from memory through a custom AVIO
/// context.
fn open(bytes: &[u8]) -> Result<ff::format::context::Input, String> {
    video::init();
    let io = ff::format::context::StreamIo::from_read_seek(Cursor::new(bytes.to_vec()))
        .map_err(|e| format!("cannot set up FFmpeg I/O: {e}"))?;
    ff::format::input_from_stream(io, None, None).map_err(|e| format!("FFmpeg cannot read it: {e}"))
}

/// The video stream of most pixels, with its decoder opened.
fn largest_stream(
    input: &ff::format::context::Input,
) -> Result<(usize, ff::decoder::Video), String> {
    let mut best: Option<(u64, usize, ff::decoder::Video)> = None;
    for stream in input.streams() {
        let params = stream.parameters();
        if params.medium() != ff::media::Type::Video {
            continue;
        }
        let Ok(ctx) = ff::codec::context::Context::from_parameters(params) else {
            continue;
        };
        let Ok(dec) = ctx.decoder().video() else {
            continue;
        };
        let px = u64::from(dec.width()) * u64::from(dec.height());
        if best.as_ref().is_none_or(|(b, _, _)| px > *b) {
            best = Some((px, stream.index(), dec));
        }
    }
    best.map(|(_, i, d)| (i, d))
        .ok_or_else(|| "FFmpeg finds no image in it".to_owned())
}

/// A decoded frame as RGBA, converted with the frame's own colour matrix
/// and range.
fn rgba(frame: &ff::frame::Video) -> Result<DynamicImage, String> {
    use ff::software::scaling::{Context, Flags};
    let (w, h) = (frame.width(), frame.height());
    let mut sc = Context::get(
        frame.format(),
        w,
        h,
        ff::format::Pixel::RGBA,
        w,
        h,
        Flags::BILINEAR | Flags::ACCURATE_RND | Flags::FULL_CHR_H_INT,
    )
    .map_err(|e| format!("cannot convert {:?} pixels: {e}", frame.format()))?;
    let space: ff::ffi::AVColorSpace = frame.color_space().into();
    let full = frame.color_range() == ff::color::Range::JPEG;
    // SAFETY: `sc` is a live swscale context; the coefficient tables are
    // swscale's static ones; the call only sets conversion parameters.
    unsafe {
        let table = ff::ffi::sws_getCoefficients(space as i32);
        ff::ffi::sws_setColorspaceDetails(
            sc.as_mut_ptr(),
            table,
            i32::from(full),
            table,
            1,
            0,
            1 << 16,
            1 << 16,
        );
    }
    let mut out = ff::frame::Video::empty();
    sc.run(frame, &mut out)
        .map_err(|e| format!("cannot convert {:?} pixels: {e}", frame.format()))?;
    let (stride, row) = (out.stride(0), w as usize * 4);
    let data = out.data(0);
    let mut pixels = Vec::with_capacity(row * h as usize);
    for y in 0..h as usize {
        pixels.extend_from_slice(&data[y * stride..y * stride + row]);
    }
    RgbaImage::from_raw(w, h, pixels)
        .map(DynamicImage::ImageRgba8)
        .ok_or_else(|| "short frame".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(format: image::ImageFormat) -> (Vec<u8>, image::RgbaImage) {
        let img = image::RgbaImage::from_fn(5, 3, |x, y| {
            image::Rgba([x as u8 * 50, y as u8 * 80, 200, 255])
        });
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgba8(img.clone())
            .into_rgb8()
            .write_to(&mut out, format)
            .unwrap();
        (out.into_inner(), img)
    }

    #[test]
    fn decodes_lossless_stills_exactly() {
        for format in [image::ImageFormat::Bmp, image::ImageFormat::Png] {
            let (bytes, want) = encode(format);
            let got = decode(&bytes, &Limits::default(), |_, _| Ok(()))
                .unwrap()
                .into_rgba8();
            assert_eq!(got, want, "{format:?}");
            let (_, w, h) = header(&bytes).unwrap();
            assert_eq!((w, h), (5, 3));
        }
    }

    #[test]
    fn refuses_by_its_limits_and_names_unreadable_bytes() {
        let (bytes, _) = encode(image::ImageFormat::Png);
        let err = decode(&bytes, &Limits::default(), |w, h| Err(format!("{w}x{h}"))).unwrap_err();
        assert_eq!(err, "5x3");
        let err = decode(b"not an image at all", &Limits::default(), |_, _| Ok(())).unwrap_err();
        assert!(err.contains("FFmpeg"), "{err}");
    }
}
