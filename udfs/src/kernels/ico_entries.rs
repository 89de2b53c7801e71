//! ICO files whose directory disagrees with the image an entry holds.
//!
//! An ICO is a directory of entries, each a PNG or a headerless BMP (a
//! DIB whose height counts its transparency mask too). Icon editors write
//! directory sizes that do not match the entry (16×32 for a 16×16 BMP, or
//! 16×16 for a larger PNG); the `image` crate refuses such a file, Pillow
//! takes the entry's own size. This module reads the directory, takes the
//! largest entry as Pillow does (by the directory's pixel count, then its
//! bit depth), and decodes that entry by what it holds: a PNG as a PNG, a
//! DIB given back its BMP file header and its height without the mask.
//! The mask itself (transparency) is not applied: an RGB result is
//! Pillow's, an RGBA one is opaque.

use std::io::Cursor;

use image::{DynamicImage, ImageFormat};

/// One directory entry.
#[derive(Debug, Clone, Copy)]
struct Entry {
    pixels: u32,
    bits: u16,
    size: usize,
    offset: usize,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The largest entry's size, read from what the entry holds.
pub fn header(bytes: &[u8]) -> Result<(u32, u32), String> {
    let (file, format) = entry_file(bytes)?;
    dimensions(&file, format)
}

/// The largest entry's image. `check` refuses its size before it is
/// decoded.
pub fn decode(
    bytes: &[u8],
    check: impl FnOnce(u32, u32) -> Result<(), String>,
) -> Result<DynamicImage, String> {
    let (file, format) = entry_file(bytes)?;
    let (w, h) = dimensions(&file, format)?;
    check(w, h)?;
    image::load_from_memory_with_format(&file, format)
        .map_err(|e| format!("bad ICO entry ({format:?}): {e}"))
}

/// The largest entry as a file of its own: a PNG, or a BMP.
fn entry_file(bytes: &[u8]) -> Result<(Vec<u8>, ImageFormat), String> {
    let entry = largest(bytes)?;
    let data = bytes
        .get(entry.offset..entry.offset.saturating_add(entry.size))
        .ok_or("ICO entry past the end of the file")?;
    Ok(if data.starts_with(b"\x89PNG") {
        (data.to_vec(), ImageFormat::Png)
    } else {
        (bmp_of_dib(data)?, ImageFormat::Bmp)
    })
}

fn dimensions(file: &[u8], format: ImageFormat) -> Result<(u32, u32), String> {
    let mut reader = image::ImageReader::new(Cursor::new(file));
    reader.set_format(format);
    reader
        .into_dimensions()
        .map_err(|e| format!("bad ICO entry ({format:?}): {e}"))
}

/// The entry of most pixels (a 0 side is 256), then most bits.
fn largest(bytes: &[u8]) -> Result<Entry, String> {
    let bad = || "bad ICO directory".to_owned();
    if u16_at(bytes, 0) != Some(0) || !matches!(u16_at(bytes, 2), Some(1 | 2)) {
        return Err(bad());
    }
    let count = usize::from(u16_at(bytes, 4).ok_or_else(bad)?);
    (0..count)
        .map(|i| {
            let at = 6 + 16 * i;
            let side = |b: u8| if b == 0 { 256 } else { u32::from(b) };
            Some(Entry {
                pixels: side(*bytes.get(at)?) * side(*bytes.get(at + 1)?),
                bits: u16_at(bytes, at + 6)?,
                size: u32_at(bytes, at + 8)? as usize,
                offset: u32_at(bytes, at + 12)? as usize,
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)?
        .into_iter()
        .max_by_key(|e| (e.pixels, e.bits))
        .ok_or_else(|| "an ICO without entries".to_owned())
}

/// A BMP file of an ICO entry's DIB: a file header in front, and the
/// height halved (the DIB's counts the AND mask's rows too).
fn bmp_of_dib(dib: &[u8]) -> Result<Vec<u8>, String> {
    let bad = |what: &str| format!("bad ICO entry: {what}");
    let header = u32_at(dib, 0).ok_or_else(|| bad("no DIB header"))?;
    if header < 40 {
        return Err(bad("a DIB header under 40 bytes"));
    }
    let height = u32_at(dib, 8).ok_or_else(|| bad("short"))? as i32;
    let bits = u16_at(dib, 14).ok_or_else(|| bad("short"))?;
    let used = u32_at(dib, 32).ok_or_else(|| bad("short"))?;
    let colours = match (bits, used) {
        (1..=8, 0) => 1u32 << bits,
        (1..=8, n) => n,
        _ => 0,
    };
    // The DIB's own sizes are the file's to claim: a header or palette
    // past the entry is the BMP decoder's error, never an overflow here.
    let pixels_at = colours
        .checked_mul(4)
        .and_then(|palette| palette.checked_add(header)?.checked_add(14))
        .ok_or_else(|| bad("a DIB header and palette past 4 GiB"))?;
    let file_len = u32::try_from(dib.len() + 14).map_err(|_| bad("an entry past 4 GiB"))?;
    let mut out = Vec::with_capacity(14 + dib.len());
    out.extend_from_slice(b"BM");
    out.extend_from_slice(&file_len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&pixels_at.to_le_bytes());
    out.extend_from_slice(dib);
    out[14 + 8..14 + 12].copy_from_slice(&(height / 2).to_le_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_palette_count_past_4_gib_is_an_error_not_an_overflow() {
        // A 40-byte DIB header of 8 bits claiming 2^31 palette colours
        // (the fuzzer's probe target found the overflow).
        let mut dib = vec![0u8; 40];
        dib[0..4].copy_from_slice(&40u32.to_le_bytes());
        dib[4..8].copy_from_slice(&1u32.to_le_bytes());
        dib[8..12].copy_from_slice(&2u32.to_le_bytes());
        dib[14..16].copy_from_slice(&8u16.to_le_bytes());
        dib[32..36].copy_from_slice(&(1u32 << 31).to_le_bytes());
        let e = bmp_of_dib(&dib).unwrap_err();
        assert!(e.contains("past 4 GiB"), "{e}");
    }

    fn ico(dir_side: u8, entry: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, 1, 0, 1, 0, dir_side, dir_side, 0, 0, 1, 0, 32, 0];
        out.extend_from_slice(&(entry.len() as u32).to_le_bytes());
        out.extend_from_slice(&22u32.to_le_bytes());
        out.extend_from_slice(entry);
        out
    }

    fn encoded(w: u32, h: u32, format: ImageFormat) -> (Vec<u8>, image::RgbImage) {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8 * 9, y as u8 * 7, 3]));
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, format).unwrap();
        (out.into_inner(), img)
    }

    #[test]
    fn takes_a_png_entry_at_its_own_size() {
        let (png, want) = encoded(24, 20, ImageFormat::Png);
        let file = ico(16, &png);
        assert!(image::load_from_memory(&file).is_err());
        let got = decode(&file, |_, _| Ok(())).unwrap().into_rgb8();
        assert_eq!(got, want);
        let err = decode(&file, |w, h| Err(format!("{w}x{h}"))).unwrap_err();
        assert_eq!(err, "24x20");
    }

    #[test]
    fn takes_a_dib_entry_without_its_mask_rows() {
        let (bmp, want) = encoded(8, 4, ImageFormat::Bmp);
        let mut dib = bmp[14..].to_vec();
        // Height doubled, as ICO DIBs count the AND mask (here its rows
        // are left out: nothing reads them).
        dib[8..12].copy_from_slice(&8i32.to_le_bytes());
        let got = decode(&ico(8, &dib), |_, _| Ok(())).unwrap().into_rgb8();
        assert_eq!(got, want);
        assert!(decode(b"\0\0\x01\0\x01\0", |_, _| Ok(())).is_err());
    }
}
