//! [`decode_clip`]: a clip's sampled frames, decoded from the start (or
//! from the key frame before a far-off sampled frame: a seek) and
//! converted to RGB at the asked size. Two parts:
//!
//! - [`Frames`]: the sampled frames as they are taken, converted by
//!   swscale into the caller's buffer; a short clip repeats its last;
//! - [`Run`]: the decoder's loop over the packets, numbering frames by
//!   their timestamps (or by counting), seeking past gaps wider than
//!   [`SEEK_GAP`] and giving up seeking where key frames are too sparse
//!   for it to help, under a work budget and the limits' time.

use std::time::Instant;

use arrow::buffer::Buffer;
use ffmpeg_next as ff;

use super::{Clock, Opened, SEEK_GAP, Sampling, open};
use crate::env::{Cancel, Limits};

/// Decodes `n` frames chosen by `sampling`, each resized to `w`×`h` RGB,
/// into `out` (`n * h * w * 3` bytes); stops with an error once `cancel`
/// is set.
pub fn decode_clip(
    data: Buffer,
    (n, h, w): (u32, u32, u32),
    sampling: Sampling,
    limits: &Limits,
    cancel: &Cancel,
    out: &mut [u8],
) -> Result<(), String> {
    let Opened {
        mut input,
        stream,
        info,
    } = open(data)?;
    let frame_px = u64::from(info.width) * u64::from(info.height);
    if frame_px == 0 {
        return Err(format!("video stream has no frame size ({})", info.codec));
    }
    let wanted = sampling.indices(n, info.frames);
    let last = wanted.last().copied().unwrap_or(0);
    limits.check(
        &format!("{}x{} {} video", info.width, info.height, info.codec),
        frame_px,
        last + 1,
        u64::from(n) * u64::from(h) * u64::from(w) * 3,
    )?;
    let params = input
        .stream(stream)
        .ok_or("the video stream vanished")?
        .parameters();
    let mut ctx = ff::codec::context::Context::from_parameters(params)
        .map_err(|e| format!("bad video stream parameters: {e}"))?;
    ctx.set_threading(ff::threading::Config::count(1));
    let dec = ctx
        .decoder()
        .video()
        .map_err(|e| format!("cannot open the {} decoder: {e}", info.codec))?;
    let clock = input.stream(stream).as_ref().and_then(Clock::new);
    let mut run = Run {
        dec,
        frame: ff::frame::Video::empty(),
        clock,
        can_seek: clock.is_some(),
        index: 0,
        decoded: 0,
        bad_packets: 0,
        // Reading every frame once, plus what seeks that land before
        // where they started can cost; past it the sample is refused
        // rather than decoded forever.
        budget: 2 * (last + 1) + 4 * SEEK_GAP * wanted.len() as u64,
        last,
        sought_from: None,
        started: Instant::now(),
        codec: &info.codec,
        limits,
    };
    let mut frames = Frames::new(&wanted, (h, w), out);
    run.read(&mut input, stream, cancel, &mut frames)?;
    run.drain(&mut frames)?;
    if run.decoded == 0 {
        return Err(format!(
            "no frame could be decoded from the {} stream ({} bad packets)",
            info.codec, run.bad_packets
        ));
    }
    frames.finish(run.index)
}

/// The sampled frames as they are taken (see the module docs).
struct Frames<'a> {
    /// The frame numbers to take, ascending.
    wanted: &'a [u64],
    taken: usize,
    /// Height and width of a taken frame.
    size: (u32, u32),
    /// Bytes of one taken frame.
    plane: usize,
    /// Made for the first frame's format and size.
    scaler: Option<ff::software::scaling::Context>,
    rgb: ff::frame::Video,
    out: &'a mut [u8],
}

impl<'a> Frames<'a> {
    fn new(wanted: &'a [u64], (h, w): (u32, u32), out: &'a mut [u8]) -> Self {
        Self {
            wanted,
            taken: 0,
            size: (h, w),
            plane: h as usize * w as usize * 3,
            scaler: None,
            rgb: ff::frame::Video::empty(),
            out,
        }
    }

    /// The next frame number to take, if any is left.
    fn next(&self) -> Option<u64> {
        self.wanted.get(self.taken).copied()
    }

    /// Takes `frame`, number `index`, for every sampled frame up to it
    /// not taken yet (a frame can stand for several, or for none).
    fn take(&mut self, frame: &ff::frame::Video, index: u64) -> Result<(), String> {
        let (h, w) = self.size;
        while self.next().is_some_and(|want| want <= index) {
            let sc = match &mut self.scaler {
                Some(s) => s,
                None => self.scaler.insert(
                    ff::software::scaling::Context::get(
                        frame.format(),
                        frame.width(),
                        frame.height(),
                        ff::format::Pixel::RGB24,
                        w,
                        h,
                        ff::software::scaling::Flags::BILINEAR,
                    )
                    .map_err(|e| format!("cannot convert {:?} frames: {e}", frame.format()))?,
                ),
            };
            sc.run(frame, &mut self.rgb)
                .map_err(|e| format!("cannot convert frame {index}: {e}"))?;
            let stride = self.rgb.stride(0);
            let src = self.rgb.data(0);
            let row_bytes = w as usize * 3;
            let dst = &mut self.out[self.taken * self.plane..(self.taken + 1) * self.plane];
            for (y, row) in dst.chunks_exact_mut(row_bytes).enumerate() {
                row.copy_from_slice(&src[y * stride..y * stride + row_bytes]);
            }
            self.taken += 1;
        }
        Ok(())
    }

    /// Fills the frames a clip of `frames` frames was too short for with
    /// the last one taken; an error when none was.
    fn finish(self, frames: u64) -> Result<(), String> {
        if self.taken == 0 {
            return Err(format!(
                "the clip has {frames} frames; the first sampled frame is {}",
                self.wanted[0]
            ));
        }
        let (taken, plane) = (self.taken, self.plane);
        for t in taken..self.wanted.len() {
            self.out
                .copy_within((taken - 1) * plane..taken * plane, t * plane);
        }
        Ok(())
    }
}

/// The decoder's loop (see the module docs).
struct Run<'a> {
    dec: ff::codec::decoder::Video,
    /// The frame last received.
    frame: ff::frame::Video,
    clock: Option<Clock>,
    can_seek: bool,
    /// The number the next frame has when it cannot be told by its
    /// timestamp.
    index: u64,
    decoded: u64,
    bad_packets: u32,
    budget: u64,
    /// The last sampled frame's number.
    last: u64,
    /// Where the decoder was when it last sought, until the first frame
    /// after the seek shows where it landed.
    sought_from: Option<u64>,
    started: Instant,
    codec: &'a str,
    limits: &'a Limits,
}

impl Run<'_> {
    /// The number of the frame just received: from its timestamp when
    /// the clip has a usable clock, else by counting.
    fn number(&self) -> u64 {
        self.clock
            .and_then(|c| self.frame.timestamp().map(|t| c.index(t)))
            .unwrap_or(self.index)
    }

    /// Reads the stream until every sampled frame is taken or it ends,
    /// seeking to the key frame before a far-off one.
    fn read(
        &mut self,
        input: &mut ff::format::context::Input,
        stream: usize,
        cancel: &Cancel,
        frames: &mut Frames<'_>,
    ) -> Result<(), String> {
        loop {
            let seek_to = self.packets(input, stream, cancel, frames)?;
            let (Some(target), Some(c)) = (seek_to, self.clock) else {
                return Ok(());
            };
            let ts = c.seek_ts(target);
            if input.seek(ts, ..ts).is_ok() {
                self.dec.flush();
                self.sought_from = Some(self.index);
            } else {
                // Not seekable: read on from here, without trying again.
                self.can_seek = false;
            }
        }
    }

    /// Decodes packets from where the demuxer is until every sampled
    /// frame is taken or the stream ends (`None`), or the next sampled
    /// frame is over [`SEEK_GAP`] ahead: its number, to seek to.
    fn packets(
        &mut self,
        input: &mut ff::format::context::Input,
        stream: usize,
        cancel: &Cancel,
        frames: &mut Frames<'_>,
    ) -> Result<Option<u64>, String> {
        for (s, packet) in input.packets() {
            if s.index() != stream {
                continue;
            }
            cancel.check()?;
            if self.dec.send_packet(&packet).is_err() {
                self.bad_packets += 1;
                continue;
            }
            while self.dec.receive_frame(&mut self.frame).is_ok() {
                let i = self.number();
                self.counted(frames.wanted.len())?;
                // A seek that did not land past where the decoder was (key
                // frames too sparse for seeking to help): read on instead.
                if let Some(from) = self.sought_from.take()
                    && i <= from
                {
                    self.can_seek = false;
                }
                self.index = i + 1;
                frames.take(&self.frame, i)?;
                let Some(next) = frames.next() else {
                    return Ok(None);
                };
                if self.can_seek && next > self.index + SEEK_GAP {
                    return Ok(Some(next));
                }
            }
        }
        Ok(None)
    }

    /// Counts a frame decoded against the limits' time and the budget
    /// (for `sampled` frames).
    fn counted(&mut self, sampled: usize) -> Result<(), String> {
        self.decoded += 1;
        let (decoded, codec) = (self.decoded, self.codec);
        self.limits.check_time(self.started, || {
            format!("decoding {decoded} frames of a {codec} stream")
        })?;
        if self.decoded > self.budget {
            return Err(format!(
                "decoded {decoded} frames of a {codec} stream to sample {sampled} up to frame \
                 {}: over the budget of {}",
                self.last, self.budget
            ));
        }
        Ok(())
    }

    /// The frames the decoder still holds at the stream's end, when some
    /// sampled frames are not taken yet.
    fn drain(&mut self, frames: &mut Frames<'_>) -> Result<(), String> {
        if frames.next().is_none() {
            return Ok(());
        }
        let _ = self.dec.send_eof();
        while self.dec.receive_frame(&mut self.frame).is_ok() {
            let i = self.number();
            self.decoded += 1;
            self.index = i + 1;
            frames.take(&self.frame, i)?;
        }
        Ok(())
    }
}
