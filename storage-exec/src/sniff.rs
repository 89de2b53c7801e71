//! Cheap facts about an object, read from its header at ingest.
//!
//! Sniffing never decodes pixels: the `image` crate's decoders are built,
//! which parses the header (JPEG SOF, PNG IHDR, WebP VP8 header …), and
//! asked for dimensions and colour type. The facts become metadata columns
//! (`format`, `width`, `height`, `channels`) that the planner uses as
//! statistics and that users filter on without reading any extent.

use std::io::Cursor;

use image::{ImageDecoder, ImageReader};

/// What a header says about an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sniffed {
    /// Container or codec name ("jpeg", "png" …).
    pub format: &'static str,
    /// Width in pixels.
    pub width: Option<u32>,
    /// Height in pixels.
    pub height: Option<u32>,
    /// Colour channels (1 grey, 2 grey+alpha, 3 RGB, 4 RGBA).
    pub channels: Option<u8>,
}

/// Reads the header of `bytes`. Errors say why the object is not usable.
pub fn sniff(bytes: &[u8]) -> Result<Sniffed, String> {
    if bytes.is_empty() {
        return Err("empty file".into());
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| format!("cannot read header: {e}"))?;
    let Some(format) = reader.format() else {
        return Err(format!(
            "not a recognised image format (first bytes: {})",
            bytes
                .iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    };
    let name = format_name(format);
    let decoder = reader
        .into_decoder()
        .map_err(|e| format!("bad {name} header: {e}"))?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(format!(
            "bad {name} header: zero-sized image {width}x{height}"
        ));
    }
    Ok(Sniffed {
        format: name,
        width: Some(width),
        height: Some(height),
        channels: Some(decoder.color_type().channel_count()),
    })
}

fn format_name(format: image::ImageFormat) -> &'static str {
    use image::ImageFormat as F;
    match format {
        F::Jpeg => "jpeg",
        F::Png => "png",
        F::WebP => "webp",
        F::Gif => "gif",
        F::Bmp => "bmp",
        F::Tiff => "tiff",
        other => other.extensions_str().first().copied().unwrap_or("image"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(format: image::ImageFormat, w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    #[test]
    fn reads_dimensions_from_headers() {
        for (fmt, name) in [
            (image::ImageFormat::Png, "png"),
            (image::ImageFormat::Jpeg, "jpeg"),
        ] {
            let s = sniff(&encode(fmt, 31, 17)).unwrap();
            assert_eq!(s.format, name);
            assert_eq!(
                (s.width, s.height, s.channels),
                (Some(31), Some(17), Some(3))
            );
        }
    }

    #[test]
    fn refuses_empty_unknown_and_truncated_objects() {
        assert_eq!(sniff(b"").unwrap_err(), "empty file");
        assert!(
            sniff(b"hello world, not an image")
                .unwrap_err()
                .contains("not a recognised image format")
        );
        let png = encode(image::ImageFormat::Png, 8, 8);
        let err = sniff(&png[..12]).unwrap_err();
        assert!(err.contains("bad png header"), "{err}");
    }
}
