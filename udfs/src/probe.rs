//! Cheap facts about an object, read from its header at ingest.
//!
//! Probing never decodes pixels or frames: image headers (JPEG SOF, PNG
//! IHDR, WebP VP8 …) through the `image` crate's decoders (and, for what
//! they refuse, through the libraries that decode it: libjpeg-turbo,
//! libtiff, FFmpeg; see `kernels::decode`), video containers
//! and stream parameters through FFmpeg, and array headers from the `.npy`
//! text (for `.npz`, the largest member's header). The facts become metadata
//! columns that the planner uses as statistics and that users filter on
//! without reading any extent.

use std::io::{BufRead, BufReader, Cursor, Read, Seek, SeekFrom};

use image::{ImageDecoder, ImageReader};

use crate::kernels::decode::{self, first_bytes};
use crate::kernels::fallback;
use crate::kernels::{npy, video};

/// What a header says about an object. (Serialized without its empty
/// fields: a failed ingest keeps one for every object it wrote.)
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Probe {
    /// Container or file format ("jpeg", "png", "mp4", "npy" …).
    pub format: String,
    /// Video codec ("h264" …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub codec: Option<String>,
    /// Width in pixels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// Height in pixels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
    /// Colour channels of an image (1 grey, 2 grey+alpha, 3 RGB, 4 RGBA).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<u8>,
    /// Frames of a video.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<u64>,
    /// Duration of a video in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// Element type of an array (NumPy's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Shape of an array.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u32>>,
}

/// Containers accepted as video (FFmpeg also "reads" text and raw data).
const VIDEO_CONTAINERS: &[&str] = &[
    "mp4",
    "matroska",
    "webm",
    "avi",
    "mpeg",
    "mpegts",
    "mpegvideo",
    "flv",
    "ogg",
    "asf",
    "h264",
    "hevc",
    "m4v",
    "ivf",
    "nut",
];

/// Bytes read from the start of an object to recognise it (and to hold a
/// `.npy` header whole).
const HEAD_BYTES: u64 = 64 * 1024;

/// Reads the header of `bytes`. Errors say why the object is not usable.
///
/// A third-party header parser that panics on an odd file refuses that
/// file with an error saying so; it does not fail the ingest.
pub fn probe(bytes: &[u8]) -> Result<Probe, String> {
    let head = &bytes[..bytes.len().min(HEAD_BYTES as usize)];
    guarded(head, || {
        probe_header(head, Cursor::new(bytes), |_| {
            video::probe(arrow::buffer::Buffer::from_slice_ref(bytes))
        })
    })
}

/// [`probe`] on an open file, reading only what the header parsers ask
/// for (the first bytes, a zip's directory, a container's index), never
/// the whole object: an ingest of a file of gigabytes holds kilobytes of
/// it to probe.
pub fn probe_file(mut file: std::fs::File) -> Result<Probe, String> {
    let mut head = Vec::with_capacity(HEAD_BYTES as usize);
    (&mut file)
        .take(HEAD_BYTES)
        .read_to_end(&mut head)
        .and_then(|_| file.seek(SeekFrom::Start(0)))
        .map_err(|e| format!("cannot read: {e}"))?;
    guarded(&head, || {
        let source = BufReader::new(file);
        probe_header(&head, source, video::probe_reader)
    })
}

/// Runs a probe, turning a header parser's panic into this file's error.
fn guarded(head: &[u8], f: impl FnOnce() -> Result<Probe, String>) -> Result<Probe, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = crate::udf::panic_message(&panic);
        Err(format!(
            "the header parser panicked on this file ({}; first bytes: {})",
            what.chars().take(200).collect::<String>(),
            first_bytes(head)
        ))
    })
}

/// Probes an object whose first bytes are `head`, reading the rest through
/// `source` (positioned at its start); `video` probes a container.
fn probe_header<R: BufRead + Seek>(
    head: &[u8],
    mut source: R,
    video: impl FnOnce(R) -> Result<video::ClipInfo, String>,
) -> Result<Probe, String> {
    if head.is_empty() {
        return Err("empty file".into());
    }
    if head.starts_with(b"\x93NUMPY") {
        return array_probe("npy", &npy::header(head)?);
    }
    if head.starts_with(b"PK\x03\x04") {
        return npz_probe(source);
    }
    // A JPEG's size from libjpeg-turbo's header read: the `image` crate's
    // builds every Huffman table to say the same (7 % of a shard ingest).
    if decode::is_jpeg(head)
        && let Ok(h) = decode::read_header(head)
    {
        return image_probe("jpeg", h.width, h.height, h.channels);
    }
    let reader = ImageReader::new(&mut source)
        .with_guessed_format()
        .map_err(|e| format!("cannot read header: {e}"))?;
    let refused = match reader.format() {
        Some(format) => {
            let name = image_format_name(format);
            match reader.into_decoder() {
                Ok(decoder) => {
                    let (width, height) = decoder.dimensions();
                    return image_probe(name, width, height, decoder.color_type().channel_count());
                }
                Err(e) => Some(format!("bad {name} header: {e}")),
            }
        }
        None => None,
    };
    source
        .seek(SeekFrom::Start(0))
        .map_err(|e| format!("cannot read: {e}"))?;
    // What the `image` crate refuses, libjpeg-turbo, libtiff or FFmpeg may
    // read (see `decode`): they read from memory, so the object is.
    if decode::is_jpeg(head) || fallback::other_decoder(head) {
        let mut bytes = Vec::new();
        (&mut source)
            .take(OTHER_DECODER_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read: {e}"))?;
        if bytes.len() as u64 > OTHER_DECODER_BYTES {
            return Err(refused.unwrap_or_else(|| {
                format!(
                    "an image over {OTHER_DECODER_BYTES} bytes that only libtiff or FFmpeg reads"
                )
            }));
        }
        // A refusal's reason carries the `image` crate's too.
        return decode::read_header(&bytes)
            .and_then(|h| image_probe(image_format_name(h.format), h.width, h.height, h.channels));
    }
    if let Some(refused) = refused {
        return Err(refused);
    }
    match video(source) {
        Ok(v) if VIDEO_CONTAINERS.contains(&v.container.as_str()) => Ok(Probe {
            format: v.container,
            codec: Some(v.codec),
            width: Some(v.width),
            height: Some(v.height),
            channels: Some(3),
            frames: v.frames,
            duration: v.duration,
            ..Probe::default()
        }),
        _ => Err(format!(
            "not a recognised image, video or array format (first bytes: {})",
            first_bytes(head)
        )),
    }
}

/// Largest object read into memory to probe it with a decoder other than
/// the `image` crate's.
const OTHER_DECODER_BYTES: u64 = 256 << 20;

fn image_probe(name: &str, width: u32, height: u32, channels: u8) -> Result<Probe, String> {
    if width == 0 || height == 0 {
        return Err(format!(
            "bad {name} header: zero-sized image {width}x{height}"
        ));
    }
    Ok(Probe {
        format: name.to_owned(),
        width: Some(width),
        height: Some(height),
        channels: Some(channels),
        ..Probe::default()
    })
}

fn array_probe(format: &str, h: &npy::Header) -> Result<Probe, String> {
    Ok(Probe {
        format: format.to_owned(),
        dtype: Some(h.dtype.name().to_owned()),
        shape: Some(h.shape.clone()),
        ..Probe::default()
    })
}

/// An `.npz` is described by its largest member's header.
fn npz_probe<R: Read + Seek>(source: R) -> Result<Probe, String> {
    let mut zip = zip::ZipArchive::new(source).map_err(|e| format!("bad zip archive: {e}"))?;
    let largest = (0..zip.len())
        .filter_map(|i| zip.by_index_raw(i).ok().map(|f| (f.size(), i)))
        .max()
        .ok_or("empty .npz archive")?
        .1;
    let mut entry = zip
        .by_index(largest)
        .map_err(|e| format!("bad .npz member: {e}"))?;
    let name = entry.name().map(|n| n.into_owned()).unwrap_or_default();
    if !name.ends_with(".npy") {
        return Err(format!("a zip archive whose member '{name}' is not a .npy"));
    }
    let mut head = Vec::with_capacity(4096);
    (&mut entry)
        .take(64 * 1024)
        .read_to_end(&mut head)
        .map_err(|e| format!("cannot inflate '{name}': {e}"))?;
    array_probe("npz", &npy::header(&head)?)
}

fn image_format_name(format: image::ImageFormat) -> &'static str {
    use image::ImageFormat as F;
    match format {
        F::Jpeg => "jpeg",
        F::Png => "png",
        F::WebP => "webp",
        F::Gif => "gif",
        F::Bmp => "bmp",
        F::Tiff => "tiff",
        F::Avif => "avif",
        F::Ico => "ico",
        other => other.extensions_str().first().copied().unwrap_or("image"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{npy::DType, npz};

    fn encode(format: image::ImageFormat, w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    #[test]
    fn reads_image_dimensions_from_headers() {
        for (fmt, name) in [
            (image::ImageFormat::Png, "png"),
            (image::ImageFormat::Jpeg, "jpeg"),
        ] {
            let p = probe(&encode(fmt, 31, 17)).unwrap();
            assert_eq!(p.format, name);
            assert_eq!(
                (p.width, p.height, p.channels),
                (Some(31), Some(17), Some(3))
            );
        }
    }

    #[test]
    fn reads_array_headers_and_video_streams() {
        let a = npy::write(DType::F32, &[4, 5, 6], &[0; 480]);
        let p = probe(&a).unwrap();
        assert_eq!(
            (p.format.as_str(), p.dtype.as_deref(), p.shape.clone()),
            ("npy", Some("float32"), Some(vec![4, 5, 6]))
        );
        let z = npz::write(
            &[("small", npy::write(DType::U8, &[2], &[1, 2])), ("big", a)],
            true,
        );
        let p = probe(&z).unwrap();
        assert_eq!((p.format.as_str(), p.shape), ("npz", Some(vec![4, 5, 6])));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.avi");
        video::encode_test_clip(&path, "mpeg4", 10, 32, 24).unwrap();
        let p = probe(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(
            (p.format.as_str(), p.codec.as_deref(), p.width, p.frames),
            ("avi", Some("mpeg4"), Some(32), Some(10))
        );
    }

    #[test]
    fn refuses_empty_unknown_and_truncated_objects() {
        assert_eq!(probe(b"").unwrap_err(), "empty file");
        let e = probe(b"hello world, not an image").unwrap_err();
        assert!(
            e.contains("not a recognised image, video or array format"),
            "{e}"
        );
        let png = encode(image::ImageFormat::Png, 8, 8);
        assert!(probe(&png[..12]).unwrap_err().contains("bad png header"));
        assert!(probe(b"\x93NUMPY\x01\x00\xff").is_err());
    }

    #[test]
    fn a_file_probes_as_its_bytes_do() {
        let dir = tempfile::tempdir().unwrap();
        let clip = dir.path().join("c.avi");
        video::encode_test_clip(&clip, "mpeg4", 6, 32, 24).unwrap();
        let a = npy::write(DType::F32, &[4, 5, 6], &[0; 480]);
        let objects = [
            encode(image::ImageFormat::Png, 31, 17),
            encode(image::ImageFormat::Jpeg, 9, 40),
            npz::write(&[("big", a.clone())], false),
            a,
            std::fs::read(&clip).unwrap(),
            b"hello world, not an image".to_vec(),
            Vec::new(),
        ];
        for (i, bytes) in objects.iter().enumerate() {
            let path = dir.path().join(format!("o{i}"));
            std::fs::write(&path, bytes).unwrap();
            let from_file = probe_file(std::fs::File::open(&path).unwrap());
            assert_eq!(from_file, probe(bytes), "object {i}");
        }
    }
}
