//! GIFs whose first frame has no colour table at all, neither its own nor
//! a global one.
//!
//! The GIF specification leaves such a frame's colours to the reader; the
//! `image` crate refuses the file ("no color table available"). Pillow
//! reads the indices as grey levels (its mode `L`), and so does this
//! module: it gives the file the grey ramp as its global colour table
//! (256 entries, index i = grey i) and decodes that with the `image`
//! crate, which draws the first frame on the logical screen as it does
//! for any GIF. A file that has a global table is left alone.

use image::DynamicImage;

/// The first frame as grey levels, or `None` when the file has a global
/// colour table (then it is not this module's). `check` refuses the
/// logical screen's size before any buffer is made.
pub fn decode(
    bytes: &[u8],
    check: impl FnOnce(u32, u32) -> Result<(), String>,
) -> Result<Option<DynamicImage>, String> {
    let Some(with_ramp) = with_grey_table(bytes)? else {
        return Ok(None);
    };
    let side = |at: usize| u32::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]));
    check(side(6), side(8))?;
    image::load_from_memory_with_format(&with_ramp, image::ImageFormat::Gif)
        .map(|img| Some(DynamicImage::ImageLuma8(img.into_luma8())))
        .map_err(|e| format!("cannot decode GIF: {e}"))
}

/// `bytes` with the grey ramp inserted as the global colour table; `None`
/// when there already is one.
fn with_grey_table(bytes: &[u8]) -> Result<Option<Vec<u8>>, String> {
    const SCREEN: usize = 13;
    if bytes.len() < SCREEN || !bytes.starts_with(b"GIF8") {
        return Err("bad GIF header".into());
    }
    let flags = bytes[10];
    if flags & 0x80 != 0 {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(bytes.len() + 768);
    out.extend_from_slice(&bytes[..SCREEN]);
    // Table present, 2^(7+1) = 256 entries; colour resolution kept.
    out[10] = 0x80 | (flags & 0x70) | 7;
    out.extend((0..=255u8).flat_map(|i| [i, i, i]));
    out.extend_from_slice(&bytes[SCREEN..]);
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    /// A 2×1 GIF87a with no colour table: indices 1 and 2.
    const NO_PALETTE: &[u8] = &[
        b'G', b'I', b'F', b'8', b'7', b'a', 2, 0, 1, 0, 0x00, 0, 0, // screen, no table
        b',', 0, 0, 0, 0, 2, 0, 1, 0, 0x00, // image descriptor, no local table
        2, 2, 0x8C, 0x0A, 0, // LZW min code 2: clear, 1, 2, end
        b';',
    ];

    #[test]
    fn reads_indices_as_grey_where_no_colour_table_exists() {
        let img = decode(NO_PALETTE, |_, _| Ok(())).unwrap().unwrap();
        assert_eq!(img.into_luma8().into_raw(), vec![1, 2]);
        assert!(image::load_from_memory(NO_PALETTE).is_err());
    }

    #[test]
    fn leaves_gifs_with_a_palette_to_the_image_crate() {
        let mut out = Cursor::new(Vec::new());
        image::RgbImage::from_pixel(3, 2, image::Rgb([9, 8, 7]))
            .write_to(&mut out, image::ImageFormat::Gif)
            .unwrap();
        assert!(decode(out.get_ref(), |_, _| Ok(())).unwrap().is_none());
        assert!(decode(b"GIF8", |_, _| Ok(())).is_err());
        let err = decode(NO_PALETTE, |w, h| Err(format!("{w}x{h}"))).unwrap_err();
        assert_eq!(err, "2x1");
    }
}
