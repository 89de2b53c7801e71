//! Horizontal flip.

use crate::tensor::ImageRef;

/// Writes `src` mirrored left-to-right into `out`.
pub fn flip_horizontal_into(src: ImageRef<'_>, out: &mut [u8]) {
    let c = usize::from(src.channels);
    let row = src.width as usize * c;
    if row == 0 {
        return;
    }
    for (s, d) in src.pixels.chunks_exact(row).zip(out.chunks_exact_mut(row)) {
        for (sp, dp) in s.chunks_exact(c).zip(d.chunks_exact_mut(c).rev()) {
            dp.copy_from_slice(sp);
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
}
