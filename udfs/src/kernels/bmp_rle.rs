//! Run-length encoded BMPs (RLE8, RLE4), expanded by Pillow's rules.
//!
//! The BMP specification says what valid runs mean, not what a reader
//! does with a run that overruns its row or a top-down RLE file, and it
//! leaves the pixels a delta skips undefined. The `image` crate refuses
//! the first two and makes skipped pixels transparent black; Pillow,
//! whose pixels training recipes were tuned on, clips a run at the row's
//! end, reads top-down files, and gives skipped pixels index 0. This
//! module expands runs the way Pillow's `BmpRleDecoder` does and looks
//! the indices up in the file's palette (an index past it is black).
//! Every RLE BMP goes through it, so a valid file decodes as it always
//! did and an odd one as Pillow decodes it. One difference: data that
//! ends before the last row (an early end-of-bitmap, which the
//! specification allows) leaves the rest index 0, where Pillow refuses
//! the file.

use image::{DynamicImage, RgbImage};

/// What the headers of an RLE BMP say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    top_down: bool,
    rle4: bool,
    palette: Vec<[u8; 3]>,
    data_at: usize,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The headers of `bytes` when it is an RLE8 or RLE4 BMP (`None` for any
/// other BMP, left to the `image` crate).
pub fn header(bytes: &[u8]) -> Result<Option<Header>, String> {
    let bad = |what: &str| format!("bad RLE BMP: {what}");
    if !bytes.starts_with(b"BM") {
        return Ok(None);
    }
    let (Some(info), Some(compression), Some(bits)) =
        (u32_at(bytes, 14), u32_at(bytes, 30), u16_at(bytes, 28))
    else {
        return Ok(None);
    };
    let rle4 = match (info, compression, bits) {
        (40.., 1, 8) => false,
        (40.., 2, 4) => true,
        _ => return Ok(None),
    };
    let width = u32_at(bytes, 18).ok_or_else(|| bad("short header"))? as i32;
    let height = u32_at(bytes, 22).ok_or_else(|| bad("short header"))? as i32;
    if width <= 0 || height == 0 {
        return Err(bad(&format!("size {width}x{height}")));
    }
    let used = u32_at(bytes, 46).unwrap_or(0);
    let colours = if used == 0 || used > 1 << bits {
        1 << bits
    } else {
        used
    };
    let palette_at = 14 + info as usize;
    let palette = (0..colours as usize)
        .map_while(|i| {
            let q = bytes.get(palette_at + 4 * i..palette_at + 4 * i + 3)?;
            Some([q[2], q[1], q[0]])
        })
        .collect();
    let data_at = u32_at(bytes, 10).ok_or_else(|| bad("short header"))? as usize;
    Ok(Some(Header {
        width: width as u32,
        height: height.unsigned_abs(),
        top_down: height < 0,
        rle4,
        palette,
        data_at,
    }))
}

/// Expands the runs as Pillow does (see the module docs): palette indices
/// in the order of the data, rows bottom-up unless the file is top-down,
/// at most `width × height` of them.
fn expand(bytes: &[u8], hd: &Header) -> Vec<u8> {
    let xsize = hd.width as usize;
    let dest = xsize * hd.height as usize;
    let mut data: Vec<u8> = Vec::with_capacity(dest);
    let mut at = hd.data_at;
    let mut x = 0usize;
    let next = |at: &mut usize| {
        let b = bytes.get(*at).copied();
        *at += 1;
        b
    };
    while data.len() < dest {
        let (Some(count), Some(byte)) = (next(&mut at), next(&mut at)) else {
            break;
        };
        if count > 0 {
            // Encoded: a run, clipped at the row's end.
            let n = usize::from(count).min(xsize.saturating_sub(x));
            if hd.rle4 {
                data.extend((0..n).map(|i| if i % 2 == 0 { byte >> 4 } else { byte & 0x0f }));
            } else {
                data.extend(std::iter::repeat_n(byte, n));
            }
            x += n;
            continue;
        }
        match byte {
            // End of line: the row's rest is index 0.
            0 => {
                let rest = (xsize - data.len() % xsize) % xsize;
                data.extend(std::iter::repeat_n(0, rest));
                x = 0;
            }
            // End of bitmap.
            1 => break,
            // Delta: skipped pixels are index 0.
            2 => {
                let (Some(right), Some(up)) = (next(&mut at), next(&mut at)) else {
                    break;
                };
                let skip = usize::from(right) + usize::from(up) * xsize;
                data.extend(std::iter::repeat_n(0, skip.min(dest - data.len())));
                x = data.len() % xsize;
            }
            // Absolute: `byte` literal pixels, then padding to an even
            // offset in the file.
            n => {
                let count = usize::from(n).min(dest - data.len());
                let need = if hd.rle4 { count.div_ceil(2) } else { count };
                let literal = &bytes[at.min(bytes.len())..(at + need).min(bytes.len())];
                at += need;
                if hd.rle4 {
                    for (i, b) in literal.iter().enumerate() {
                        data.push(b >> 4);
                        if i * 2 + 1 < count {
                            data.push(b & 0x0f);
                        }
                    }
                } else {
                    data.extend_from_slice(literal);
                }
                if literal.len() < need || data.len() == dest {
                    break;
                }
                x += usize::from(n);
                at += at % 2;
            }
        }
    }
    data.truncate(dest);
    data
}

/// Decodes an RLE BMP whose [`header`] is `hd`.
pub fn decode(bytes: &[u8], hd: &Header) -> DynamicImage {
    let indices = expand(bytes, hd);
    let (w, h) = (hd.width as usize, hd.height as usize);
    let mut img = RgbImage::new(hd.width, hd.height);
    for (i, &index) in indices.iter().enumerate() {
        let (row, x) = (i / w, i % w);
        let y = if hd.top_down { row } else { h - 1 - row };
        let rgb = hd
            .palette
            .get(usize::from(index))
            .copied()
            .unwrap_or([0; 3]);
        img.put_pixel(x as u32, y as u32, image::Rgb(rgb));
    }
    // Rows the data never reached are index 0, as Pillow leaves them.
    let zero = hd.palette.first().copied().unwrap_or([0; 3]);
    for i in indices.len()..w * h {
        let (row, x) = (i / w, i % w);
        let y = if hd.top_down { row } else { h - 1 - row };
        img.put_pixel(x as u32, y as u32, image::Rgb(zero));
    }
    DynamicImage::ImageRgb8(img)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `w`×`h` RLE8 BMP of 4 colours whose data is `rle`.
    fn rle8(w: i32, h: i32, rle: &[u8]) -> Vec<u8> {
        let palette: Vec<u8> = (0..4u8).flat_map(|i| [i, 10 * i, 100 + i, 0]).collect();
        let off = 14 + 40 + palette.len();
        let mut out = b"BM".to_vec();
        out.extend_from_slice(&((off + rle.len()) as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&(off as u32).to_le_bytes());
        for v in [40u32, w as u32, h as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&8u16.to_le_bytes());
        for v in [1u32, rle.len() as u32, 2835, 2835, 4, 0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&palette);
        out.extend_from_slice(rle);
        out
    }

    fn colour(i: u8) -> [u8; 3] {
        [100 + i, 10 * i, i]
    }

    fn pixels(bytes: &[u8]) -> Vec<[u8; 3]> {
        let hd = header(bytes).unwrap().unwrap();
        decode(bytes, &hd)
            .into_rgb8()
            .pixels()
            .map(|p| p.0)
            .collect()
    }

    #[test]
    fn a_valid_file_decodes_as_the_image_crate_decodes_it() {
        // Bottom row: four 1s; top row: one 2, then 3 3 0 literally (and
        // a pad byte to an even offset), end of bitmap.
        let bytes = rle8(4, 2, &[4, 1, 0, 0, 1, 2, 0, 3, 3, 3, 0, 0, 0, 1]);
        let want: Vec<[u8; 3]> = image::load_from_memory(&bytes)
            .unwrap()
            .into_rgb8()
            .pixels()
            .map(|p| p.0)
            .collect();
        assert_eq!(pixels(&bytes), want);
        assert_eq!(&want[..4], &[colour(2), colour(3), colour(3), colour(0)]);
        assert_eq!(&want[4..], &[colour(1); 4]);
    }

    #[test]
    fn runs_past_the_row_are_clipped_and_missing_rows_are_index_0() {
        // Row 0 (bottom): a run of 6 in a row of 4; then the data ends.
        let bytes = rle8(4, 2, &[6, 2, 0, 0]);
        assert!(image::load_from_memory(&bytes).is_err());
        let got = pixels(&bytes);
        assert_eq!(&got[4..], &[colour(2); 4], "bottom row");
        assert_eq!(&got[..4], &[colour(0); 4], "top row never reached");
        // Top-down, and a delta that skips two pixels.
        let bytes = rle8(4, -1, &[1, 3, 0, 2, 2, 0, 1, 1, 0, 1]);
        assert_eq!(
            pixels(&bytes),
            vec![colour(3), colour(0), colour(0), colour(1)]
        );
        // Not RLE: not this module's.
        assert_eq!(header(b"BM\0\0").unwrap(), None);
    }
}
