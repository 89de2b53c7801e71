//! Image decoding, full-size or JPEG DCT-domain downscaled.
//!
//! [`decode`] uses zune-jpeg directly for JPEG (in strict mode: a truncated
//! or corrupt stream is an error, as in Pillow, not a grey-filled image) and
//! the `image` crate for the other formats. [`decode_at_least`]
//! asks a JPEG decoder to run its inverse DCT at 1/2, 1/4 or 1/8 size when the
//! caller needs far fewer pixels than the file holds: the entropy decoding
//! still reads every coefficient, but the IDCT, upsampling and colour
//! conversion run on the small image, and no full-size buffer is allocated.
//! It is the technique behind PIL's `draft` mode and DALI's ROI decode.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};

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

/// Format and dimensions from the header, with the limits checked.
pub fn header(
    bytes: &[u8],
    mode: Mode,
    limits: &Limits,
) -> Result<(ImageFormat, u32, u32), String> {
    if bytes.is_empty() {
        return Err("empty object".into());
    }
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
    let (w, h) = decoder.dimensions();
    check(w, h, mode, limits)?;
    Ok((format, w, h))
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

/// Decodes a whole JPEG with zune-jpeg in strict mode.
fn decode_jpeg(bytes: &[u8], mode: Mode, w: u32, h: u32) -> Result<Image, String> {
    use zune_jpeg::zune_core::bytestream::ZCursor;
    use zune_jpeg::zune_core::colorspace::ColorSpace;
    use zune_jpeg::zune_core::options::DecoderOptions;
    let colorspace = match mode {
        Mode::Rgb => ColorSpace::RGB,
        Mode::L => ColorSpace::Luma,
        Mode::Rgba => ColorSpace::RGBA,
    };
    // Size limits are ours (checked from the header already).
    let options = DecoderOptions::default()
        .set_strict_mode(true)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX))
        .jpeg_set_out_colorspace(colorspace);
    let mut d = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    let pixels = d
        .decode()
        .map_err(|e| format!("cannot decode JPEG: {e:?}"))?;
    let expected = w as usize * h as usize * usize::from(mode.channels());
    if pixels.len() != expected {
        return Err(format!(
            "cannot decode JPEG: {} bytes decoded for {w}x{h}",
            pixels.len()
        ));
    }
    Ok(Image {
        height: h,
        width: w,
        channels: mode.channels(),
        pixels,
    })
}

/// Decodes a whole image.
pub fn decode(bytes: &[u8], mode: Mode, limits: &Limits) -> Result<Image, String> {
    let (format, w, h) = header(bytes, mode, limits)?;
    if format == ImageFormat::Jpeg {
        return decode_jpeg(bytes, mode, w, h);
    }
    let mut reader = ImageReader::new(Cursor::new(bytes));
    reader.set_format(format);
    let mut il = image::Limits::default();
    il.max_alloc = Some(
        limits
            .max_decoded_bytes
            .max(u64::from(w) * u64::from(h) * 8),
    );
    reader.limits(il);
    let img = reader
        .decode()
        .map_err(|e| format!("cannot decode {format:?}: {e}"))?;
    Ok(mode.convert(img))
}

/// Whether `bytes` start like a JPEG.
pub fn is_jpeg(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xff, 0xd8, 0xff])
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

/// Decodes an image no smaller than `min_w`×`min_h`, downscaling in the DCT
/// domain when the file is a JPEG at least twice as large; otherwise decodes
/// it whole. `full` is the original size (from [`header`]).
pub fn decode_at_least(
    bytes: &[u8],
    mode: Mode,
    full: (u32, u32),
    min_w: f64,
    min_h: f64,
    limits: &Limits,
) -> Result<Scaled, String> {
    let (w, h) = full;
    let s = (f64::from(w) / min_w.max(1.0)).min(f64::from(h) / min_h.max(1.0));
    if s >= 2.0 && is_jpeg(bytes) && w <= u32::from(u16::MAX) && h <= u32::from(u16::MAX) {
        let mut d = jpeg_decoder::Decoder::new(Cursor::new(bytes));
        let req_w = (f64::from(w) / s).ceil() as u16;
        let req_h = (f64::from(h) / s).ceil() as u16;
        let (sw, sh) = d
            .scale(req_w.max(1), req_h.max(1))
            .map_err(|e| format!("cannot decode JPEG: {e}"))?;
        let raw = d.decode().map_err(|e| format!("cannot decode JPEG: {e}"))?;
        let info = d.info().ok_or("cannot decode JPEG: no frame header")?;
        let (sw, sh) = (u32::from(sw), u32::from(sh));
        let img = jpeg_to_dynamic(raw, sw, sh, info.pixel_format)?;
        return Ok(Scaled {
            image: mode.convert(img),
            factor_x: f64::from(w) / f64::from(sw),
            factor_y: f64::from(h) / f64::from(sh),
        });
    }
    Ok(Scaled {
        image: decode(bytes, mode, limits)?,
        factor_x: 1.0,
        factor_y: 1.0,
    })
}

fn jpeg_to_dynamic(
    raw: Vec<u8>,
    w: u32,
    h: u32,
    format: jpeg_decoder::PixelFormat,
) -> Result<DynamicImage, String> {
    use jpeg_decoder::PixelFormat as P;
    let short = || format!("cannot decode JPEG: short pixel buffer for {w}x{h}");
    Ok(match format {
        P::RGB24 => {
            DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, raw).ok_or_else(short)?)
        }
        P::L8 => DynamicImage::ImageLuma8(image::GrayImage::from_raw(w, h, raw).ok_or_else(short)?),
        P::L16 => {
            let px: Vec<u16> = raw
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            DynamicImage::ImageLuma16(image::ImageBuffer::from_raw(w, h, px).ok_or_else(short)?)
        }
        P::CMYK32 => {
            let rgb: Vec<u8> = raw
                .chunks_exact(4)
                .flat_map(|p| {
                    let k = u32::from(p[3]);
                    [0, 1, 2].map(|i| (u32::from(p[i]) * k / 255) as u8)
                })
                .collect();
            DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, rgb).ok_or_else(short)?)
        }
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
        let s = decode_at_least(
            &bytes,
            Mode::Rgb,
            (800, 600),
            100.0,
            75.0,
            &Limits::default(),
        )
        .unwrap();
        assert_eq!((s.image.width, s.image.height), (100, 75));
        assert_eq!((s.factor_x, s.factor_y), (8.0, 8.0));
        // The pixel at (x, y) of the small image averages an 8x8 block whose
        // red channel is about 8x + 3.5 in the source.
        let r = s.image.pixels[(10 * 100 + 10) * 3];
        assert!((i32::from(r) - 83).abs() <= 6, "{r}");
        // Not a JPEG, or not much larger: decoded whole.
        let full = decode_at_least(
            &bytes,
            Mode::Rgb,
            (800, 600),
            500.0,
            400.0,
            &Limits::default(),
        )
        .unwrap();
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
