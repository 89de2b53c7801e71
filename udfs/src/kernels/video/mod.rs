//! Video clips through FFmpeg (ffmpeg-next): probe, and decode sampled
//! frames resized to RGB.
//!
//! The container is read straight from the sample's bytes through a custom
//! AVIO context (`StreamIo` over an Arrow buffer: no temporary file, no copy
//! of the object). Frames are decoded from the start, one decoder thread
//! (the executor parallelises across samples), and the sampled ones are
//! converted by swscale to packed RGB at the requested size. Frames are
//! identified by their timestamps; when the next sampled frame is more than
//! [`SEEK_GAP`] frames ahead (uniform sampling of a long clip), the demuxer
//! seeks to the key frame before it instead of decoding everything in
//! between. A clip with fewer frames than asked for repeats its last frame.
//!
//! Here: opening and probing a clip, its clock, the sampling. Beside it:
//! - `decode`: [`decode_clip`], the sampled frames decoded and converted;
//! - `test_clip`: [`encode_test_clip`], synthetic clips whose frames can be
//!   told apart (tests, benchmarks, calibration).

use std::io::Cursor;
use std::sync::Once;

use arrow::buffer::Buffer;
use ffmpeg_next as ff;

mod decode;
mod test_clip;

pub use decode::decode_clip;
pub use test_clip::{encode_test_clip, encode_test_clip_with_gop};

/// Initialises FFmpeg once (and silences its logging).
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // Registration is automatic since FFmpeg 4; errors reach us as codes,
        // so FFmpeg's own logging would only duplicate them on stderr.
        let _ = ff::init();
        ff::util::log::set_level(ff::util::log::Level::Quiet);
    });
}

/// Which frames of a clip to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampling {
    /// Frames 0, k, 2k, …
    Stride(u32),
    /// Spread evenly over the clip.
    Uniform,
}

impl Sampling {
    /// Parses an integer stride (≥ 1) or `'uniform'`.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("uniform") {
            return Ok(Self::Uniform);
        }
        match s.parse::<u32>() {
            Ok(k) if k >= 1 => Ok(Self::Stride(k)),
            _ => Err(format!(
                "stride must be a positive integer or 'uniform', got '{s}'"
            )),
        }
    }

    /// The frame indices to take, given the clip's frame count (when known).
    pub fn indices(self, n: u32, total: Option<u64>) -> Vec<u64> {
        match (self, total) {
            (Self::Stride(k), _) => (0..u64::from(n)).map(|i| i * u64::from(k)).collect(),
            (Self::Uniform, Some(t)) if t > 0 => (0..u64::from(n))
                .map(|i| ((i as f64 + 0.5) * t as f64 / f64::from(n)) as u64)
                .map(|i| i.min(t - 1))
                .collect(),
            (Self::Uniform, _) => (0..u64::from(n)).collect(),
        }
    }
}

/// What probing a clip tells.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipInfo {
    /// Container ("mp4", "matroska", "avi" …).
    pub container: String,
    /// Video codec ("h264", "mpeg4", "vp9" …).
    pub codec: String,
    /// Frame width.
    pub width: u32,
    /// Frame height.
    pub height: u32,
    /// Frame count (from the container, or duration × frame rate).
    pub frames: Option<u64>,
    /// Duration in seconds.
    pub duration: Option<f64>,
}

/// An Arrow buffer as the `AsRef<[u8]>` a `Cursor` reads (no copy).
struct Bytes(Buffer);

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Frames ahead beyond which decoding seeks instead of reading on.
pub const SEEK_GAP: u64 = 48;

/// Maps timestamps to frame numbers (constant frame rate assumed).
#[derive(Debug, Clone, Copy)]
struct Clock {
    start: i128,
    /// Stream time base, num/den seconds per unit.
    tb: (i128, i128),
    /// Frame rate, num/den frames per second.
    fps: (i128, i128),
}

impl Clock {
    fn new(stream: &ff::format::stream::Stream<'_>) -> Option<Self> {
        let (tb, fr) = (stream.time_base(), stream.avg_frame_rate());
        if [
            tb.numerator(),
            tb.denominator(),
            fr.numerator(),
            fr.denominator(),
        ]
        .iter()
        .any(|v| *v <= 0)
        {
            return None;
        }
        let start = match stream.start_time() {
            t if t == ff::ffi::AV_NOPTS_VALUE => 0,
            t => t,
        };
        Some(Self {
            start: i128::from(start),
            tb: (i128::from(tb.numerator()), i128::from(tb.denominator())),
            fps: (i128::from(fr.numerator()), i128::from(fr.denominator())),
        })
    }

    /// The frame number at timestamp `ts` (nearest frame).
    fn index(&self, ts: i64) -> u64 {
        let num = (i128::from(ts) - self.start) * self.tb.0 * self.fps.0;
        let den = self.tb.1 * self.fps.1;
        u64::try_from((2 * num + den).div_euclid(2 * den)).unwrap_or(0)
    }

    /// A container timestamp (AV_TIME_BASE units) half a frame before frame `i`.
    fn seek_ts(&self, i: u64) -> i64 {
        let us = i128::from(ff::ffi::AV_TIME_BASE);
        let start = self.start * self.tb.0 * us / self.tb.1;
        let at = (2 * i128::from(i)).saturating_sub(1).max(0) * self.fps.1 * us / (2 * self.fps.0);
        i64::try_from(start + at).unwrap_or(i64::MAX)
    }
}

struct Opened {
    input: ff::format::context::Input,
    stream: usize,
    info: ClipInfo,
}

fn open(data: Buffer) -> Result<Opened, String> {
    if data.is_empty() {
        return Err("empty object".into());
    }
    open_reader(Cursor::new(Bytes(data)))
}

/// Opens a container read through `source` (a file, or bytes in memory):
/// FFmpeg reads and seeks only what it needs.
fn open_reader<R: std::io::Read + std::io::Seek + Send + 'static>(
    source: R,
) -> Result<Opened, String> {
    init();
    let io = ff::format::context::StreamIo::from_read_seek(source)
        .map_err(|e| format!("cannot set up FFmpeg I/O: {e}"))?;
    let input = ff::format::input_from_stream(io, None, None)
        .map_err(|e| format!("not a video FFmpeg can read: {e}"))?;
    let stream = input
        .streams()
        .best(ff::media::Type::Video)
        .ok_or("the container has no video stream")?;
    let params = stream.parameters();
    let ctx = ff::codec::context::Context::from_parameters(params.clone())
        .map_err(|e| format!("bad video stream parameters: {e}"))?;
    let dec = ctx
        .decoder()
        .video()
        .map_err(|e| format!("no decoder for codec {}: {e}", params.id().name()))?;
    let rate = stream.avg_frame_rate();
    let tb = stream.time_base();
    let seconds = |ts: i64, base: ff::Rational| {
        (ts > 0 && base.denominator() != 0)
            .then(|| ts as f64 * f64::from(base.numerator()) / f64::from(base.denominator()))
    };
    let duration = seconds(stream.duration(), tb).or_else(|| {
        seconds(
            input.duration(),
            ff::Rational::new(1, ff::ffi::AV_TIME_BASE),
        )
    });
    let frames = match stream.frames() {
        n if n > 0 => Some(n as u64),
        _ => duration
            .filter(|_| rate.denominator() != 0 && rate.numerator() > 0)
            .map(|d| {
                (d * f64::from(rate.numerator()) / f64::from(rate.denominator())).round() as u64
            }),
    };
    let container = match input.format().name().split(',').next().unwrap_or("") {
        "mov" => "mp4".to_owned(),
        other => other.to_owned(),
    };
    let info = ClipInfo {
        container,
        codec: params.id().name().to_owned(),
        width: dec.width(),
        height: dec.height(),
        frames,
        duration,
    };
    Ok(Opened {
        stream: stream.index(),
        input,
        info,
    })
}

/// Probes a clip's container and video stream without decoding frames.
pub fn probe(data: Buffer) -> Result<ClipInfo, String> {
    if data.is_empty() {
        return Err("empty object".into());
    }
    probe_reader(Cursor::new(Bytes(data)))
}

/// [`probe`] on a seekable source (a file at ingest), reading only the
/// container's header and index rather than the whole object.
pub fn probe_reader<R: std::io::Read + std::io::Seek + Send + 'static>(
    source: R,
) -> Result<ClipInfo, String> {
    let info = open_reader(source)?.info;
    if info.width == 0 || info.height == 0 {
        return Err(format!("video stream has no frame size ({})", info.codec));
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{Cancel, Limits};

    fn clip(codec: &str, ext: &str, frames: u32) -> Buffer {
        clip_with_gop(codec, ext, frames, 12)
    }

    fn clip_with_gop(codec: &str, ext: &str, frames: u32, gop: u32) -> Buffer {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("c.{ext}"));
        encode_test_clip_with_gop(&path, codec, frames, 64, 48, gop).unwrap();
        Buffer::from_vec(std::fs::read(&path).unwrap())
    }

    fn mean(frame: &[u8]) -> f64 {
        frame.iter().map(|&v| f64::from(v)).sum::<f64>() / frame.len() as f64
    }

    #[test]
    fn probes_and_decodes_strided_frames() {
        let data = clip("mpeg4", "avi", 20);
        let info = probe(data.clone()).unwrap();
        assert_eq!(
            (info.container.as_str(), info.codec.as_str()),
            ("avi", "mpeg4")
        );
        assert_eq!((info.width, info.height, info.frames), (64, 48, Some(20)));
        let mut out = vec![0; 4 * 16 * 16 * 3];
        decode_clip(
            data,
            (4, 16, 16),
            Sampling::Stride(3),
            &Limits::default(),
            &Cancel::default(),
            &mut out,
        )
        .unwrap();
        // Frames 0, 3, 6, 9 get brighter by about 24 levels each.
        let means: Vec<f64> = out.chunks(16 * 16 * 3).map(mean).collect();
        for pair in means.windows(2) {
            assert!(pair[1] > pair[0] + 10.0, "{means:?}");
        }
    }

    #[test]
    fn reads_the_containers_and_codecs_debian_ships() {
        // (encoder, file extension, probed container, probed codec)
        for (enc, ext, container, codec) in [
            ("libx264", "mp4", "mp4", "h264"),
            ("mpeg4", "avi", "avi", "mpeg4"),
            ("libvpx-vp9", "webm", "matroska", "vp9"),
            ("libx264", "mkv", "matroska", "h264"),
            ("mpeg2video", "mpg", "mpeg", "mpeg2video"),
        ] {
            let data = clip(enc, ext, 12);
            let info = probe(data.clone()).unwrap();
            assert_eq!(
                (info.container.as_str(), info.codec.as_str()),
                (container, codec),
                "{enc}/{ext}"
            );
            assert_eq!((info.width, info.height), (64, 48), "{enc}/{ext}");
            let mut out = vec![0; 3 * 8 * 8 * 3];
            decode_clip(
                data,
                (3, 8, 8),
                Sampling::Stride(4),
                &Limits::default(),
                &Cancel::default(),
                &mut out,
            )
            .unwrap();
            let means: Vec<f64> = out.chunks(8 * 8 * 3).map(mean).collect();
            assert!(
                means.windows(2).all(|w| w[1] > w[0]),
                "{enc}/{ext}: {means:?}"
            );
        }
    }

    #[test]
    fn seeking_through_a_long_clip_gives_the_frames_reading_on_would() {
        // 400 frames, a key frame every 12: uniform sampling of 4 seeks three times.
        for (enc, ext) in [("mpeg4", "avi"), ("libx264", "mp4")] {
            let data = clip(enc, ext, 400);
            let wanted = Sampling::Uniform.indices(4, Some(400));
            assert!(wanted.windows(2).all(|w| w[1] - w[0] > SEEK_GAP));
            let mut seeking = vec![0; 4 * 16 * 16 * 3];
            decode_clip(
                data.clone(),
                (4, 16, 16),
                Sampling::Uniform,
                &Limits::default(),
                &Cancel::default(),
                &mut seeking,
            )
            .unwrap();
            // The same frames one by one, as strides from frame 0 never seek.
            for (k, &f) in wanted.iter().enumerate() {
                let mut one = vec![0; 2 * 16 * 16 * 3];
                let stride = u32::try_from(f).unwrap().max(1);
                decode_clip(
                    data.clone(),
                    (2, 16, 16),
                    Sampling::Stride(stride),
                    &Limits::default(),
                    &Cancel::default(),
                    &mut one,
                )
                .unwrap();
                let plane = 16 * 16 * 3;
                assert_eq!(
                    &seeking[k * plane..(k + 1) * plane],
                    &one[plane..],
                    "{enc}: frame {f}"
                );
            }
        }
    }

    #[test]
    fn uniform_sampling_of_a_clip_with_sparse_key_frames_ends_with_the_right_frames() {
        // One key frame in 1,200 frames (the MS-MPEG4 clip of the
        // hostile-input report had 4 in 795), sampled 75 frames apart: every
        // seek lands back at the start, which used to send the decoder back
        // there for ever.
        for (enc, ext) in [("mpeg4", "avi"), ("libx264", "mp4")] {
            let data = clip_with_gop(enc, ext, 1200, 2000);
            let wanted = Sampling::Uniform.indices(16, Some(1200));
            assert!(wanted.windows(2).all(|w| w[1] - w[0] > SEEK_GAP));
            let mut out = vec![0; 16 * 16 * 16 * 3];
            let started = std::time::Instant::now();
            decode_clip(
                data.clone(),
                (16, 16, 16),
                Sampling::Uniform,
                &Limits::default(),
                &Cancel::default(),
                &mut out,
            )
            .unwrap();
            assert!(
                started.elapsed().as_secs() < 60,
                "{enc}: {:?}",
                started.elapsed()
            );
            let mut all = vec![0; 1200 * 16 * 16 * 3];
            decode_clip(
                data,
                (1200, 16, 16),
                Sampling::Stride(1),
                &Limits::default(),
                &Cancel::default(),
                &mut all,
            )
            .unwrap();
            let plane = 16 * 16 * 3;
            for (k, &f) in wanted.iter().enumerate() {
                let f = f as usize;
                assert_eq!(
                    &out[k * plane..(k + 1) * plane],
                    &all[f * plane..(f + 1) * plane],
                    "{enc}: frame {f}"
                );
            }
        }
    }

    #[test]
    fn uniform_sampling_spreads_over_the_clip_and_short_clips_repeat() {
        assert_eq!(Sampling::Uniform.indices(4, Some(40)), [5, 15, 25, 35]);
        assert_eq!(Sampling::parse("2").unwrap(), Sampling::Stride(2));
        assert!(Sampling::parse("0").is_err());
        let data = clip("mpeg4", "avi", 3);
        let mut out = vec![0; 5 * 8 * 8 * 3];
        decode_clip(
            data,
            (5, 8, 8),
            Sampling::Stride(1),
            &Limits::default(),
            &Cancel::default(),
            &mut out,
        )
        .unwrap();
        let plane = 8 * 8 * 3;
        assert_eq!(out[2 * plane..3 * plane], out[4 * plane..5 * plane]);
    }

    #[test]
    fn corrupt_and_foreign_bytes_are_errors() {
        let l = Limits::default();
        let mut out = vec![0; 8 * 8 * 3];
        let e = decode_clip(
            Buffer::from_vec(b"definitely not a video".to_vec()),
            (1, 8, 8),
            Sampling::Stride(1),
            &l,
            &Cancel::default(),
            &mut out,
        );
        assert!(e.is_err());
        let data = clip("mpeg4", "avi", 10);
        let mut bytes = data.to_vec();
        let n = bytes.len();
        for b in &mut bytes[n / 4..n - 64] {
            *b = 0x5a;
        }
        // Corrupt payload: an error or some frames, never a crash.
        let _ = decode_clip(
            Buffer::from_vec(bytes),
            (1, 8, 8),
            Sampling::Stride(1),
            &l,
            &Cancel::default(),
            &mut out,
        );
        let tight = Limits { max_frames: 4, ..l };
        let hasty = Limits {
            max_sample_ms: 0,
            ..l
        };
        let mut out = vec![0; 2 * 8 * 8 * 3];
        let e = decode_clip(
            clip("mpeg4", "avi", 40),
            (2, 8, 8),
            Sampling::Stride(30),
            &hasty,
            &Cancel::default(),
            &mut out,
        )
        .unwrap_err();
        assert!(e.contains("max_sample_ms"), "{e}");
        let e = decode_clip(
            data,
            (6, 8, 8),
            Sampling::Stride(1),
            &tight,
            &Cancel::default(),
            &mut vec![0; 6 * 192],
        )
        .unwrap_err();
        assert!(e.contains("max_frames"), "{e}");
    }

    #[test]
    fn a_cancel_stops_the_frame_loop() {
        let cancel = Cancel::default();
        cancel.cancel();
        let e = decode_clip(
            clip("mpeg4", "avi", 40),
            (4, 8, 8),
            Sampling::Uniform,
            &Limits::default(),
            &cancel,
            &mut vec![0; 4 * 192],
        )
        .unwrap_err();
        assert_eq!(e, crate::env::CANCELLED);
    }
}
