//! Synthetic clips for tests, benchmarks and calibration
//! ([`encode_test_clip`]): each frame a uniform grey of its own level with
//! a moving bright square, so that a test can tell which frame it got,
//! encoded by whichever of FFmpeg's encoders is named.

use ffmpeg_next as ff;

use super::init;

/// Encodes a synthetic clip to `path` with `codec` (e.g. "mpeg4", "libx264",
/// "libvpx-vp9", "mpeg2video"): frame `i` is a uniform grey of level
/// `16 + (8 * i) % 200` with a moving bright square, so tests can tell frames
/// apart. For tests, benchmarks and calibration.
pub fn encode_test_clip(
    path: &std::path::Path,
    codec: &str,
    frames: u32,
    w: u32,
    h: u32,
) -> Result<(), String> {
    encode_test_clip_with_gop(path, codec, frames, w, h, 12)
}

/// [`encode_test_clip`] with a key frame every `gop` frames.
pub fn encode_test_clip_with_gop(
    path: &std::path::Path,
    codec: &str,
    frames: u32,
    w: u32,
    h: u32,
    gop: u32,
) -> Result<(), String> {
    init();
    let e = |what: &'static str| move |err: ff::Error| format!("{what}: {err}");
    let mut octx = ff::format::output(path).map_err(e("cannot create the output"))?;
    let enc_codec =
        ff::encoder::find_by_name(codec).ok_or_else(|| format!("no encoder '{codec}'"))?;
    let global = octx
        .format()
        .flags()
        .contains(ff::format::Flags::GLOBAL_HEADER);
    let mut ost = octx
        .add_stream(enc_codec)
        .map_err(e("cannot add a stream"))?;
    let mut enc = ff::codec::context::Context::new_with_codec(enc_codec)
        .encoder()
        .video()
        .map_err(e("not a video encoder"))?;
    let fps = 25;
    enc.set_width(w);
    enc.set_height(h);
    enc.set_format(ff::format::Pixel::YUV420P);
    enc.set_time_base(ff::Rational::new(1, fps));
    enc.set_frame_rate(Some(ff::Rational::new(fps, 1)));
    enc.set_gop(gop);
    if global {
        enc.set_flags(ff::codec::Flags::GLOBAL_HEADER);
    }
    // Key frames exactly every `gop` frames: no extra ones at scene cuts
    // (every frame here changes its level).
    let mut opts = ff::Dictionary::new();
    opts.set("sc_threshold", "1000000000");
    if codec == "libx264" {
        opts.set("x264-params", "scenecut=0");
    }
    let mut enc = enc
        .open_as_with(enc_codec, opts)
        .map_err(e("cannot open the encoder"))?;
    ost.set_parameters(&enc);
    ost.set_time_base(ff::Rational::new(1, fps));
    octx.write_header().map_err(e("cannot write the header"))?;
    let ost_tb = octx
        .stream(0)
        .map(|s| s.time_base())
        .unwrap_or(ff::Rational::new(1, fps));
    let mut packet = ff::Packet::empty();
    let mut drain = |enc: &mut ff::encoder::Video,
                     octx: &mut ff::format::context::Output|
     -> Result<(), String> {
        while enc.receive_packet(&mut packet).is_ok() {
            packet.set_stream(0);
            packet.rescale_ts(ff::Rational::new(1, fps), ost_tb);
            packet
                .write_interleaved(octx)
                .map_err(e("cannot write a packet"))?;
        }
        Ok(())
    };
    for i in 0..frames {
        let mut f = ff::frame::Video::new(ff::format::Pixel::YUV420P, w, h);
        let level = (16 + (8 * i) % 200) as u8;
        let stride = f.stride(0);
        let sq = (i * 3) % w.max(1);
        let y = f.data_mut(0);
        for row in 0..h as usize {
            for col in 0..w as usize {
                let inside = (col as u32).wrapping_sub(sq) < 8 && row < 8;
                y[row * stride + col] = if inside { 235 } else { level };
            }
        }
        for p in 1..3 {
            f.data_mut(p).fill(128);
        }
        f.set_pts(Some(i64::from(i)));
        enc.send_frame(&f).map_err(e("cannot encode a frame"))?;
        drain(&mut enc, &mut octx)?;
    }
    enc.send_eof().map_err(e("cannot flush the encoder"))?;
    drain(&mut enc, &mut octx)?;
    octx.write_trailer().map_err(e("cannot write the trailer"))
}
