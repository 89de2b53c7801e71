//! Tiled TIFFs whose samples are stored in separate planes
//! (PlanarConfiguration 2): the `image` crate's TIFF path cannot read them
//! (an assertion in it fails on every such file), Pillow can. They are
//! decoded here tile by tile and plane by plane with the `tiff` crate
//! under `image`, and the planes interleaved into one image of 8- or
//! 16-bit samples.

use std::io::Cursor;

use image::{DynamicImage, ImageBuffer, Luma, LumaA, Pixel, Rgb, Rgba};
use tiff::ColorType;
use tiff::decoder::{ChunkType, Decoder, DecodingResult};
use tiff::tags::Tag;

/// The image of `bytes` when they are a tiled TIFF with separate planes;
/// `None` for any other file (left to the `image` crate). The caller has
/// checked the header's size against its limits.
pub fn decode(bytes: &[u8]) -> Result<Option<DynamicImage>, String> {
    let err = |e: tiff::TiffError| format!("cannot decode tiled planar TIFF: {e}");
    let Ok(mut d) = Decoder::new(Cursor::new(bytes)) else {
        return Ok(None);
    };
    let planar = d
        .find_tag_unsigned::<u16>(Tag::PlanarConfiguration)
        .map_err(err)?;
    if d.get_chunk_type() != ChunkType::Tile || planar != Some(2) {
        return Ok(None);
    }
    let (w, h) = d.dimensions().map_err(err)?;
    let (spp, bits) = match d.colortype().map_err(err)? {
        ColorType::Gray(b) => (1, b),
        ColorType::GrayA(b) => (2, b),
        ColorType::RGB(b) => (3, b),
        ColorType::RGBA(b) => (4, b),
        other => return Err(format!("tiled planar TIFF of {other:?} is not supported")),
    };
    if bits != 8 && bits != 16 {
        return Err(format!(
            "tiled planar TIFF with {bits}-bit samples is not supported"
        ));
    }
    let (tw, th) = d.chunk_dimensions();
    if tw == 0 || th == 0 {
        return Err("tiled planar TIFF with empty tiles".into());
    }
    let across = w.div_ceil(tw);
    let per_plane = across * h.div_ceil(th);
    let tiles = d.tile_count().map_err(err)?;
    if u64::from(tiles) < u64::from(per_plane) * spp as u64 {
        return Err(format!(
            "tiled planar TIFF holds {tiles} tiles, {} needed",
            u64::from(per_plane) * spp as u64
        ));
    }
    let (wu, hu) = (w as usize, h as usize);
    let mut out = vec![0u16; wu * hu * spp];
    for plane in 0..spp {
        for t in 0..per_plane {
            let index = plane as u32 * per_plane + t;
            let (cw, ch) = d.chunk_data_dimensions(index);
            let (x0, y0) = ((t % across) * tw, (t / across) * th);
            let (cw, ch) = (cw.min(w - x0) as usize, ch.min(h - y0) as usize);
            let chunk = d.read_chunk(index).map_err(err)?;
            let sample = |i: usize| -> Option<u16> {
                match &chunk {
                    DecodingResult::U8(v) => v.get(i).map(|&s| u16::from(s)),
                    DecodingResult::U16(v) => v.get(i).copied(),
                    _ => None,
                }
            };
            for y in 0..ch {
                for x in 0..cw {
                    let s = sample(y * cw + x).ok_or_else(|| {
                        format!("tiled planar TIFF: tile {index} is shorter than {cw}x{ch}")
                    })?;
                    out[((y0 as usize + y) * wu + x0 as usize + x) * spp + plane] = s;
                }
            }
        }
    }
    let image = match (spp, bits) {
        (1, 8) => DynamicImage::ImageLuma8(buffer::<Luma<u8>>(w, h, narrow(out))?),
        (2, 8) => DynamicImage::ImageLumaA8(buffer::<LumaA<u8>>(w, h, narrow(out))?),
        (3, 8) => DynamicImage::ImageRgb8(buffer::<Rgb<u8>>(w, h, narrow(out))?),
        (4, 8) => DynamicImage::ImageRgba8(buffer::<Rgba<u8>>(w, h, narrow(out))?),
        (1, _) => DynamicImage::ImageLuma16(buffer::<Luma<u16>>(w, h, out)?),
        (2, _) => DynamicImage::ImageLumaA16(buffer::<LumaA<u16>>(w, h, out)?),
        (3, _) => DynamicImage::ImageRgb16(buffer::<Rgb<u16>>(w, h, out)?),
        _ => DynamicImage::ImageRgba16(buffer::<Rgba<u16>>(w, h, out)?),
    };
    Ok(Some(image))
}

/// 8-bit samples held as u16, back to u8.
fn narrow(samples: Vec<u16>) -> Vec<u8> {
    samples.into_iter().map(|s| s as u8).collect()
}

fn buffer<P: Pixel>(
    w: u32,
    h: u32,
    samples: Vec<P::Subpixel>,
) -> Result<ImageBuffer<P, Vec<P::Subpixel>>, String> {
    ImageBuffer::from_raw(w, h, samples).ok_or_else(|| "tiled planar TIFF: short image".into())
}
