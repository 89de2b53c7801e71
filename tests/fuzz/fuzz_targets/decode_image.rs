//! Any bytes through `decode_image`'s kernel, in the mode the input's
//! length picks: a result or an error, within the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_udfs::kernels::decode::{Mode, decode};

fuzz_target!(init: sluice_fuzz::quiet_panics(), |data: &[u8]| {
    let mode = [Mode::Rgb, Mode::L, Mode::Rgba][data.len() % 3];
    let limits = sluice_fuzz::limits();
    if let Some(Ok(img)) = sluice_fuzz::as_in_serve(|| decode(data, mode, &limits)) {
        let v = img.view();
        assert_eq!(
            v.pixels.len(),
            v.height as usize * v.width as usize * usize::from(v.channels)
        );
    }
});
