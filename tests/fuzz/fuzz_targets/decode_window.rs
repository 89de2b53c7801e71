//! The windowed JPEG decode (`decode_random_resized_crop`'s path through
//! libjpeg-turbo with skipped and cropped scanlines) and the DCT-scaled
//! decode, on any bytes: the first four bytes pick the scale and the
//! window, the rest is the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_udfs::kernels::decode::{Codec, Mode, decode_at_least, header, scaled};
use sluice_udfs::kernels::jpeg_window::decode_window;

fuzz_target!(|data: &[u8]| {
    let Some((knobs, file)) = data.split_first_chunk::<4>() else {
        return;
    };
    let mode = [Mode::Rgb, Mode::L, Mode::Rgba][usize::from(knobs[0] % 3)];
    let limits = sluice_fuzz::limits();
    let Ok(hd) = header(file, mode, &limits) else {
        return;
    };
    let m = 1 << (knobs[0] / 3 % 4);
    if let Ok(s) = decode_at_least(
        file,
        mode,
        &hd,
        f64::from(hd.width) * f64::from(m) / 8.0,
        f64::from(hd.height) * f64::from(m) / 8.0,
        &limits,
    ) {
        let img = &s.image;
        assert_eq!(
            img.pixels.len(),
            img.height as usize * img.width as usize * usize::from(img.channels)
        );
    }
    if hd.codec != Codec::Turbo {
        return;
    }
    let (sw, sh) = scaled(hd.width, hd.height, m);
    let frac = |k: u8, side: u32| (u64::from(k) * u64::from(side) / 256) as u32;
    let (left, top) = (frac(knobs[1], sw), frac(knobs[2], sh));
    let width = (sw - left).clamp(1, frac(knobs[3], sw).max(1));
    let height = (sh - top).clamp(1, frac(knobs[3], sh).max(1));
    if let Ok(win) = decode_window(file, mode, m, sw, (left, top, width, height)) {
        let img = &win.image;
        assert_eq!(img.height, height);
        assert!(win.left <= left && win.left + img.width >= left + width);
        assert_eq!(
            img.pixels.len(),
            img.height as usize * img.width as usize * usize::from(img.channels)
        );
    }
});
