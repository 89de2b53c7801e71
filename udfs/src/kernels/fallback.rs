//! [`Fallback`]: the library that reads a file the `image` crate refuses,
//! chosen by the file's first bytes (see `decode`'s module docs for which
//! library reads what, and why).

use image::{DynamicImage, ImageFormat};

use crate::env::Limits;

/// Whether a file starting with `head` is one that a decoder other than
/// the `image` crate's may read where it does not (a TIFF, AVIF, GIF, BMP
/// or ICO by its magic bytes).
pub fn other_decoder(head: &[u8]) -> bool {
    Fallback::of(head).is_some()
}

/// The library that reads what the `image` crate refuses, chosen by the
/// file's first bytes (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// libtiff.
    Libtiff,
    /// AVIF, through FFmpeg.
    Avif,
    /// An RLE BMP.
    BmpRle,
    /// A GIF frame without any colour table.
    GifGrey,
    /// An ICO entry at its own size.
    IcoEntries,
}

impl Fallback {
    /// The library for a file starting with `bytes`, if any.
    pub(crate) fn of(bytes: &[u8]) -> Option<Self> {
        let tiff = [b"II*\0", b"MM\0*", b"II+\0", b"MM\0+"];
        if tiff.iter().any(|m| bytes.starts_with(*m)) {
            return Some(Self::Libtiff);
        }
        Some(match bytes {
            [
                _,
                _,
                _,
                _,
                b'f',
                b't',
                b'y',
                b'p',
                b'a',
                b'v',
                b'i',
                b'f' | b's',
                ..,
            ] => Self::Avif,
            [b'B', b'M', ..] if matches!(super::bmp_rle::header(bytes), Ok(Some(_))) => {
                Self::BmpRle
            }
            [b'G', b'I', b'F', b'8', ..] => Self::GifGrey,
            [0, 0, 1 | 2, 0, ..] => Self::IcoEntries,
            _ => return None,
        })
    }

    /// The format of the files it reads.
    pub(crate) fn format(self) -> ImageFormat {
        match self {
            Self::Libtiff => ImageFormat::Tiff,
            Self::Avif => ImageFormat::Avif,
            Self::BmpRle => ImageFormat::Bmp,
            Self::GifGrey => ImageFormat::Gif,
            Self::IcoEntries => ImageFormat::Ico,
        }
    }

    /// The image's (width, height, channels stored).
    pub(crate) fn size(self, bytes: &[u8]) -> Result<(u32, u32, u8), String> {
        Ok(match self {
            Self::Libtiff => {
                let h = super::libtiff::header(bytes)?;
                (h.width, h.height, h.channels)
            }
            Self::Avif => {
                let (_, w, h) = super::ffmpeg_still::header(bytes)?;
                (w, h, 3)
            }
            Self::BmpRle => {
                let h = super::bmp_rle::header(bytes)?.ok_or("not a run-length encoded BMP")?;
                (h.width, h.height, 3)
            }
            Self::GifGrey => {
                let side = |at: usize| {
                    bytes
                        .get(at..at + 2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                };
                let (Some(w), Some(h)) = (side(6), side(8)) else {
                    return Err("bad GIF header".into());
                };
                (u32::from(w), u32::from(h), 1)
            }
            Self::IcoEntries => {
                let (w, h) = super::ico_entries::header(bytes)?;
                (w, h, 4)
            }
        })
    }

    /// Decodes the image; `check` refuses its size before any pixel
    /// buffer is made.
    pub(crate) fn decode(
        self,
        bytes: &[u8],
        limits: &Limits,
        check: impl Fn(u32, u32) -> Result<(), String>,
    ) -> Result<DynamicImage, String> {
        Ok(match self {
            Self::Libtiff => super::libtiff::decode(bytes, limits.max_decoded_bytes, check)?,
            Self::Avif => super::ffmpeg_still::decode(bytes, limits, check)?,
            Self::BmpRle => {
                let h = super::bmp_rle::header(bytes)?.ok_or("not a run-length encoded BMP")?;
                check(h.width, h.height)?;
                super::bmp_rle::decode(bytes, &h)
            }
            Self::GifGrey => super::gif_grey::decode(bytes, check)?
                .ok_or("the GIF has a colour table: the image crate's reason stands")?,
            Self::IcoEntries => super::ico_entries::decode(bytes, check)?,
        })
    }
}
