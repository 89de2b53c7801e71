//! Image decoding, full-size or JPEG DCT-domain downscaled.
//!
//! Which library decodes what ([`Codec`]):
//!
//! - JPEG: libjpeg-turbo (TurboJPEG API, SIMD), the decoder Pillow and
//!   torchvision use. Its warnings after which the whole image is still
//!   decoded (stray bytes before a marker, an `FF 00` where a marker
//!   should be) are taken, in the header as in the data; a truncated
//!   stream is an error, as in Pillow, not a grey-filled image. CMYK and
//!   YCCK JPEGs go through the `image` crate.
//! - PNG, WebP, GIF, BMP, ICO, TIFF, PNM: the `image` crate (pure Rust).
//! - TIFFs it refuses (CCITT fax, LZMA, old-style JPEG, CIELab, YCbCr,
//!   palette, 2/4-bit grey, BigTIFF, a zero page count): libtiff
//!   ([`super::libtiff`]).
//!
//! The libraries beside the `image` crate are chosen by a file's first
//! bytes ([`super::fallback`]).
//! - AVIF: FFmpeg ([`super::ffmpeg_still`]; libdav1d for AV1).
//! - RLE BMPs: expanded by Pillow's rules ([`super::bmp_rle`]: runs past a
//!   row clipped, skipped pixels index 0, top-down files read).
//! - A GIF frame without any colour table: indices as grey, as Pillow
//!   ([`super::gif_grey`]).
//! - An ICO whose directory disagrees with its entry: the entry at its own
//!   size ([`super::ico_entries`]).
//!
//! [`decode_at_least`] asks libjpeg-turbo to run its inverse DCT at
//! M/8 scale (M = 1, 2, 4 or 8: the scales with SIMD IDCTs) when the caller needs fewer pixels than the file
//! holds: the entropy decoding still reads every coefficient, but the IDCT,
//! upsampling and colour conversion run on the small image, and no
//! full-size buffer is allocated. It is the technique behind PIL's `draft`
//! mode and DALI's ROI decode.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};

use super::fallback::Fallback;
use crate::env::Limits;
use crate::tensor::Image;

/// Colour layout of a decoded image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 3 channels.
    Rgb,
    /// 1 channel (luma).
    L,
    /// 4 channels.
    Rgba,
}

impl Mode {
    /// Parses 'RGB', 'L' or 'RGBA'.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.to_ascii_uppercase().as_str() {
            "RGB" => Ok(Self::Rgb),
            "L" => Ok(Self::L),
            "RGBA" => Ok(Self::Rgba),
            other => Err(format!("unknown mode '{other}' (expected RGB, L or RGBA)")),
        }
    }

    /// Channels of the mode.
    pub fn channels(self) -> u8 {
        match self {
            Self::Rgb => 3,
            Self::L => 1,
            Self::Rgba => 4,
        }
    }

    fn convert(self, img: DynamicImage) -> Image {
        let (w, h) = (img.width(), img.height());
        let pixels = match self {
            Self::Rgb => img.into_rgb8().into_raw(),
            Self::L => img.into_luma8().into_raw(),
            Self::Rgba => img.into_rgba8().into_raw(),
        };
        Image {
            height: h,
            width: w,
            channels: self.channels(),
            pixels,
        }
    }
}

/// The library that decodes an image (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// libjpeg-turbo: a JPEG it decodes to RGB/L/RGBA (not CMYK/YCCK).
    Turbo,
    /// The `image` crate.
    Image,
    /// The library that reads what the `image` crate refuses.
    Fallback(Fallback),
}

/// What an image's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The format.
    pub format: ImageFormat,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Colour channels the file stores (1 grey … 4 RGBA; 3 where the
    /// library does not say).
    pub channels: u8,
    /// Who decodes it.
    pub codec: Codec,
}

/// Reads the header once and checks the limits.
pub fn header(bytes: &[u8], mode: Mode, limits: &Limits) -> Result<Header, String> {
    let hd = read_header(bytes)?;
    check(hd.width, hd.height, mode, limits)?;
    Ok(hd)
}

/// Reads the header (libjpeg-turbo for JPEG, the `image` crate otherwise,
/// libtiff or FFmpeg for what it refuses), without checking limits.
pub fn read_header(bytes: &[u8]) -> Result<Header, String> {
    if bytes.is_empty() {
        return Err("empty object".into());
    }
    if is_jpeg(bytes) {
        let (width, height, colorspace) = jpeg_header(bytes)?;
        use turbojpeg::Colorspace as C;
        let turbo = matches!(colorspace, C::RGB | C::YCbCr | C::Gray);
        if turbo || image_decoder(bytes).is_ok() {
            return Ok(Header {
                format: ImageFormat::Jpeg,
                width,
                height,
                channels: if colorspace == C::Gray { 1 } else { 3 },
                codec: if turbo { Codec::Turbo } else { Codec::Image },
            });
        }
    }
    // Every RLE BMP by Pillow's rules (see `bmp_rle`).
    if let Some(h) = super::bmp_rle::header(bytes)? {
        return Ok(Header {
            format: ImageFormat::Bmp,
            width: h.width,
            height: h.height,
            channels: 3,
            codec: Codec::Fallback(Fallback::BmpRle),
        });
    }
    let refused = match image_decoder(bytes) {
        Ok((format, decoder)) => {
            let (width, height) = decoder.dimensions();
            return Ok(Header {
                format,
                width,
                height,
                channels: decoder.color_type().channel_count(),
                codec: Codec::Image,
            });
        }
        Err(e) => e,
    };
    let Some(fallback) = Fallback::of(bytes) else {
        return Err(refused);
    };
    let (width, height, channels) = fallback
        .size(bytes)
        .map_err(|e| format!("{refused}; {e}"))?;
    Ok(Header {
        format: fallback.format(),
        width,
        height,
        channels,
        codec: Codec::Fallback(fallback),
    })
}

/// Decodes with the library that reads what the `image` crate refuses.
fn decode_fallback(
    fallback: Fallback,
    bytes: &[u8],
    mode: Mode,
    limits: &Limits,
) -> Result<Image, String> {
    let img = fallback.decode(bytes, limits, |w, h| check(w, h, mode, limits))?;
    Ok(mode.convert(img))
}

/// libjpeg-turbo's reading of a JPEG header: (width, height, colourspace).
/// A warning after which the header was read whole (stray bytes before a
/// marker) is taken, as libjpeg itself takes it.
fn jpeg_header(bytes: &[u8]) -> Result<(u32, u32, turbojpeg::Colorspace), String> {
    let read = with_turbo(|d| match d.read_header(bytes) {
        Ok(h) => Ok((h.width, h.height, h.colorspace)),
        Err(e) => Err(format!("bad JPEG header: {e}")),
    });
    let (w, h, colorspace) = match read {
        Ok(h) => h,
        Err(e) if tolerable_warning(e.trim_start_matches("bad JPEG header: TurboJPEG error: ")) => {
            jpeg_header_past_warnings(bytes).ok_or(e)?
        }
        Err(e) => return Err(e),
    };
    // A stream cut before its frame header reads as 0x0 rather than
    // failing: that is a bad header too.
    if w == 0 || h == 0 {
        return Err("bad JPEG header: no frame header before the data ends".to_owned());
    }
    Ok((
        u32::try_from(w).unwrap_or(u32::MAX),
        u32::try_from(h).unwrap_or(u32::MAX),
        colorspace,
    ))
}

/// The header TurboJPEG read before it reported a warning: its wrapper
/// turns the warning into an error and drops the values, so the header is
/// read again through the raw API, whose outputs are filled either way.
fn jpeg_header_past_warnings(bytes: &[u8]) -> Option<(usize, usize, turbojpeg::Colorspace)> {
    use turbojpeg::raw;
    let len = std::os::raw::c_ulong::try_from(bytes.len()).ok()?;
    let (mut w, mut h, mut sub, mut cs) = (0, 0, 0, 0);
    // SAFETY: a handle of our own, destroyed below; TurboJPEG reads `len`
    // bytes of `bytes` and writes the four integers passed by pointer.
    unsafe {
        let handle = raw::tjInitDecompress();
        if handle.is_null() {
            return None;
        }
        raw::tjDecompressHeader3(
            handle,
            bytes.as_ptr(),
            len,
            &mut w,
            &mut h,
            &mut sub,
            &mut cs,
        );
        raw::tjDestroy(handle);
    }
    use turbojpeg::Colorspace as C;
    let colorspace = match u32::try_from(cs).ok()? {
        raw::TJCS_TJCS_RGB => C::RGB,
        raw::TJCS_TJCS_YCbCr => C::YCbCr,
        raw::TJCS_TJCS_GRAY => C::Gray,
        raw::TJCS_TJCS_CMYK => C::CMYK,
        raw::TJCS_TJCS_YCCK => C::YCCK,
        _ => return None,
    };
    Some((
        usize::try_from(w).ok()?,
        usize::try_from(h).ok()?,
        colorspace,
    ))
}

/// The `image` crate's decoder for `bytes`, its header read.
fn image_decoder(bytes: &[u8]) -> Result<(ImageFormat, Box<dyn image::ImageDecoder + '_>), String> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| format!("cannot read header: {e}"))?;
    let format = reader.format().ok_or_else(|| {
        format!(
            "not a recognised image format (first bytes: {})",
            first_bytes(bytes)
        )
    })?;
    let decoder = reader
        .into_decoder()
        .map_err(|e| format!("bad {format:?} header: {e}"))?;
    Ok((format, Box::new(decoder)))
}

fn check(w: u32, h: u32, mode: Mode, limits: &Limits) -> Result<(), String> {
    if w == 0 || h == 0 {
        return Err(format!("zero-sized image {w}x{h}"));
    }
    let px = u64::from(w) * u64::from(h);
    limits.check(
        &format!("image {w}x{h}"),
        px,
        1,
        px * u64::from(mode.channels()),
    )
}

/// The first bytes of an object, in hex, for messages.
pub fn first_bytes(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

thread_local! {
    static TURBO: std::cell::RefCell<Option<turbojpeg::Decompressor>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's libjpeg-turbo decompressor, made once and
/// replaced after an error (a handle that failed mid-stream may keep stale
/// state: the next header read on it reports 0x0).
fn with_turbo<T>(
    f: impl FnOnce(&mut turbojpeg::Decompressor) -> Result<T, String>,
) -> Result<T, String> {
    TURBO.with(|t| {
        let mut t = t.borrow_mut();
        let d = match t.as_mut() {
            Some(d) => d,
            None => t.insert(
                turbojpeg::Decompressor::new()
                    .map_err(|e| format!("cannot start libjpeg-turbo: {e}"))?,
            ),
        };
        let result = f(d);
        if result.is_err() {
            *t = None;
        }
        result
    })
}

/// Whether a TurboJPEG message is one of libjpeg's warnings (JWRN_*) after
/// which the whole image was still decoded: stray bytes between segments,
/// a bad Huffman or arithmetic code, a restart marker out of place, an
/// unknown JFIF revision. A file that ends early ("Premature end of JPEG
/// file") is not one: its missing rows would be grey, and Pillow refuses it
/// as truncated.
pub(crate) fn tolerable_warning(msg: &str) -> bool {
    const WARNINGS: [&str; 5] = [
        "Corrupt JPEG data:",
        "Warning: unknown JFIF revision",
        "Warning: thumbnail image size does not match",
        "Inconsistent progression sequence",
        "Unknown Adobe color transform code",
    ];
    WARNINGS.iter().any(|w| msg.starts_with(w)) && !msg.contains("premature end of data segment")
}

/// Sides of a `w`×`h` JPEG decoded at `m`/8 scale (TurboJPEG's TJSCALED).
pub fn scaled(w: u32, h: u32, m: u32) -> (u32, u32) {
    ((w * m).div_ceil(8), (h * m).div_ceil(8))
}

/// Decodes a JPEG with libjpeg-turbo at `m`/8 scale.
fn decode_jpeg(bytes: &[u8], mode: Mode, w: u32, h: u32, m: u32) -> Result<Image, String> {
    let (sw, sh) = scaled(w, h, m);
    let (format, c) = match mode {
        Mode::Rgb => (turbojpeg::PixelFormat::RGB, 3usize),
        Mode::L => (turbojpeg::PixelFormat::GRAY, 1),
        Mode::Rgba => (turbojpeg::PixelFormat::RGBA, 4),
    };
    let mut pixels = vec![0u8; sw as usize * sh as usize * c];
    let image = turbojpeg::Image {
        pixels: pixels.as_mut_slice(),
        width: sw as usize,
        pitch: sw as usize * c,
        height: sh as usize,
        format,
    };
    with_turbo(|d| match d.decompress(bytes, image) {
        Ok(()) => Ok(()),
        // libjpeg decoded every scanline and only warned: Pillow (and so
        // every PyTorch recipe) takes such a file, so do we.
        Err(turbojpeg::Error::TurboJpegError(msg)) if tolerable_warning(&msg) => Ok(()),
        Err(e) => Err(format!("cannot decode JPEG: {e}")),
    })?;
    Ok(Image {
        height: sh,
        width: sw,
        channels: c as u8,
        pixels,
    })
}

/// Decodes a whole image.
pub fn decode(bytes: &[u8], mode: Mode, limits: &Limits) -> Result<Image, String> {
    let hd = header(bytes, mode, limits)?;
    decode_full(bytes, mode, &hd, limits)
}

/// Decodes a whole image whose header is `hd`.
fn decode_full(bytes: &[u8], mode: Mode, hd: &Header, limits: &Limits) -> Result<Image, String> {
    match hd.codec {
        Codec::Turbo => decode_jpeg(bytes, mode, hd.width, hd.height, 8),
        Codec::Fallback(fallback) => decode_fallback(fallback, bytes, mode, limits),
        Codec::Image => match decode_image_crate(bytes, mode, hd, limits) {
            Ok(img) => Ok(img),
            // What the `image` crate refuses in a file it could read the
            // header of (a TIFF compression, RLE that overruns): the
            // library that takes such files, and both reasons if it fails.
            Err(refused) => match Fallback::of(bytes) {
                Some(fallback) => decode_fallback(fallback, bytes, mode, limits)
                    .map_err(|e| format!("{refused}; {e}")),
                None => Err(refused),
            },
        },
    }
}

/// Decodes with the `image` crate (and the planar TIFF reader beside it).
fn decode_image_crate(
    bytes: &[u8],
    mode: Mode,
    hd: &Header,
    limits: &Limits,
) -> Result<Image, String> {
    if hd.format == ImageFormat::Tiff
        && let Some(img) = super::tiff_planar::decode(bytes)?
    {
        return Ok(mode.convert(img));
    }
    let (format, mut decoder) = image_decoder(bytes)?;
    let mut il = image::Limits::default();
    il.max_alloc = Some(
        limits
            .max_decoded_bytes
            .max(u64::from(hd.width) * u64::from(hd.height) * 8),
    );
    decoder
        .set_limits(il)
        .map_err(|e| format!("cannot decode {format:?}: {e}"))?;
    let img = DynamicImage::from_decoder(decoder)
        .map_err(|e| format!("cannot decode {format:?}: {e}"))?;
    Ok(mode.convert(img))
}

/// Whether `bytes` start like a JPEG.
pub fn is_jpeg(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xff, 0xd8, 0xff])
}

/// The smallest M of 1, 2, 4 and 8 whose M/8 scale keeps a `w`×`h` JPEG
/// at least `min_w`×`min_h`. libjpeg-turbo has SIMD inverse DCTs for those
/// scales only: at 3/8, 5/8, 6/8 and 7/8 it runs generic C IDCTs (and
/// upsamples chroma inside them), slower than the full 8/8 decode.
pub fn dct_scale(w: u32, h: u32, min_w: f64, min_h: f64) -> u32 {
    [1, 2, 4]
        .into_iter()
        .find(|&m| {
            let (sw, sh) = scaled(w, h, m);
            f64::from(sw) >= min_w && f64::from(sh) >= min_h
        })
        .unwrap_or(8)
}

/// A decoded image and the factor its sides were divided by.
#[derive(Debug)]
pub struct Scaled {
    /// The image.
    pub image: Image,
    /// Original width / decoded width (1, 2, 4 or 8 for JPEG DCT scaling).
    pub factor_x: f64,
    /// Original height / decoded height.
    pub factor_y: f64,
}

/// Decodes an image no smaller than `min_w`×`min_h`, downscaling in the
/// DCT domain (by the smallest M/8 that keeps both sides at least that
/// large) when the file is a JPEG; otherwise decodes it whole. `hd` is its
/// [`header`].
pub fn decode_at_least(
    bytes: &[u8],
    mode: Mode,
    hd: &Header,
    min_w: f64,
    min_h: f64,
    limits: &Limits,
) -> Result<Scaled, String> {
    let (w, h) = (hd.width, hd.height);
    let m = dct_scale(w, h, min_w, min_h);
    if m < 8 && hd.codec == Codec::Turbo {
        let image = decode_jpeg(bytes, mode, w, h, m)?;
        return Ok(Scaled {
            factor_x: f64::from(w) / f64::from(image.width),
            factor_y: f64::from(h) / f64::from(image.height),
            image,
        });
    }
    Ok(Scaled {
        image: decode_full(bytes, mode, hd, limits)?,
        factor_x: 1.0,
        factor_y: 1.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn jpeg(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([(x % 256) as u8, (y % 256) as u8, 128])
        });
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Jpeg).unwrap();
        out.into_inner()
    }

    #[test]
    fn stray_bytes_between_segments_are_a_warning_not_a_bad_sample() {
        // "Corrupt JPEG data: 3 extraneous bytes before marker 0xd9": libjpeg
        // warns and decodes everything; Pillow takes the file too.
        let good = jpeg(64, 48);
        assert_eq!(&good[good.len() - 2..], &[0xff, 0xd9]);
        let mut stray = good[..good.len() - 2].to_vec();
        stray.extend_from_slice(&[0x12, 0x34, 0x56, 0xff, 0xd9]);
        let want = decode(&good, Mode::Rgb, &Limits::default()).unwrap();
        let got = decode(&stray, Mode::Rgb, &Limits::default()).unwrap();
        assert_eq!(got.pixels, want.pixels);
        let hd = header(&stray, Mode::Rgb, &Limits::default()).unwrap();
        let small = decode_at_least(&stray, Mode::Rgb, &hd, 16.0, 12.0, &Limits::default());
        assert!(small.is_ok(), "{small:?}");
        // A file cut short is still refused.
        let cut = &good[..good.len() * 2 / 3];
        let err = decode(cut, Mode::Rgb, &Limits::default()).unwrap_err();
        assert!(err.contains("JPEG"), "{err}");
        assert!(!tolerable_warning("Premature end of JPEG file"));
        assert!(tolerable_warning(
            "Corrupt JPEG data: 3 extraneous bytes before marker 0xd9"
        ));
    }

    #[test]
    fn decodes_in_each_mode() {
        let bytes = jpeg(40, 30);
        for (mode, c) in [(Mode::Rgb, 3), (Mode::L, 1), (Mode::Rgba, 4)] {
            let img = decode(&bytes, mode, &Limits::default()).unwrap();
            assert_eq!((img.width, img.height, img.channels), (40, 30, c));
            assert_eq!(img.pixels.len(), 40 * 30 * usize::from(c));
        }
    }

    #[test]
    fn dct_scaling_decodes_a_smaller_image_close_to_the_full_one() {
        let bytes = jpeg(800, 600);
        let hd = header(&bytes, Mode::Rgb, &Limits::default()).unwrap();
        assert_eq!((hd.width, hd.height, hd.codec), (800, 600, Codec::Turbo));
        let s = decode_at_least(&bytes, Mode::Rgb, &hd, 100.0, 75.0, &Limits::default()).unwrap();
        assert_eq!((s.image.width, s.image.height), (100, 75));
        assert_eq!((s.factor_x, s.factor_y), (8.0, 8.0));
        // The pixel at (x, y) of the small image averages an 8x8 block whose
        // red channel is about 8x + 3.5 in the source.
        let r = s.image.pixels[(10 * 100 + 10) * 3];
        assert!((i32::from(r) - 83).abs() <= 6, "{r}");
        // 4/8 is the smallest SIMD scale that keeps 300x200 (3/8 would).
        let l = Limits::default();
        let s = decode_at_least(&bytes, Mode::Rgb, &hd, 300.0, 200.0, &l).unwrap();
        assert_eq!((s.image.width, s.image.height), (400, 300));
        // No smaller scale keeps 750x590: decoded whole.
        let full = decode_at_least(&bytes, Mode::Rgb, &hd, 750.0, 590.0, &l).unwrap();
        assert_eq!((full.image.width, full.factor_x), (800, 1.0));
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        let l = Limits::default();
        assert_eq!(decode(b"", Mode::Rgb, &l).unwrap_err(), "empty object");
        assert!(decode(b"GIF89a-not-really", Mode::Rgb, &l).is_err());
        let e = decode(b"just some text here", Mode::Rgb, &l).unwrap_err();
        assert!(e.contains("not a recognised image format"), "{e}");
        let bytes = jpeg(64, 64);
        let e = decode(&bytes[..bytes.len() / 2], Mode::Rgb, &l);
        // A truncated JPEG either fails or decodes with grey fill, never panics.
        if let Err(e) = e {
            assert!(e.contains("JPEG") || e.contains("Jpeg"), "{e}");
        }
    }
}
