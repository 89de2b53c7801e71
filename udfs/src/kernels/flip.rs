//! Horizontal flip.

use crate::tensor::ImageRef;

/// Writes `src` mirrored left-to-right into `out`.
pub fn flip_horizontal_into(src: ImageRef<'_>, out: &mut [u8]) {
    let c = usize::from(src.channels);
    let row = src.width as usize * c;
    if row == 0 {
        return;
    }
    // A pixel's size known at compile time makes each pixel's move a
    // register load and store; a size known only at run time is a call to
    // `memcpy` per pixel (it was 5% of an epoch's cycles).
    match c {
        1 => mirror_rows::<1>(src.pixels, out, row),
        2 => mirror_rows::<2>(src.pixels, out, row),
        3 => mirror_rows::<3>(src.pixels, out, row),
        4 => mirror_rows::<4>(src.pixels, out, row),
        _ => {
            for (s, d) in src.pixels.chunks_exact(row).zip(out.chunks_exact_mut(row)) {
                for (sp, dp) in s.chunks_exact(c).zip(d.chunks_exact_mut(c).rev()) {
                    dp.copy_from_slice(sp);
                }
            }
        }
    }
}

/// Mirrors rows of `row` bytes, pixels of `N` bytes.
fn mirror_rows<const N: usize>(src: &[u8], out: &mut [u8], row: usize) {
    for (s, d) in src.chunks_exact(row).zip(out.chunks_exact_mut(row)) {
        let (s, _) = s.as_chunks::<N>();
        let (d, _) = d.as_chunks_mut::<N>();
        for (sp, dp) in s.iter().zip(d.iter_mut().rev()) {
            *dp = *sp;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_each_row_keeping_channel_order() {
        let px = [1, 2, 3, 4, 5, 6, 7, 8];
        let src = ImageRef {
            height: 2,
            width: 2,
            channels: 2,
            pixels: &px,
        };
        let mut out = [0; 8];
        flip_horizontal_into(src, &mut out);
        assert_eq!(out, [3, 4, 1, 2, 7, 8, 5, 6]);
    }

    #[test]
    fn every_pixel_size_mirrors_alike() {
        for c in 1..=5u8 {
            let (w, h) = (7u32, 3u32);
            let px: Vec<u8> = (0..w * h * u32::from(c)).map(|i| i as u8).collect();
            let src = ImageRef {
                height: h,
                width: w,
                channels: c,
                pixels: &px,
            };
            let mut out = vec![0; px.len()];
            flip_horizontal_into(src, &mut out);
            let c = usize::from(c);
            for y in 0..h as usize {
                for x in 0..w as usize {
                    let (s, d) = (
                        (y * w as usize + x) * c,
                        (y * w as usize + w as usize - 1 - x) * c,
                    );
                    assert_eq!(out[d..d + c], px[s..s + c], "c={c} x={x} y={y}");
                }
            }
        }
    }
}
