//! Image columns: a row read back as a borrowed [`ImageRef`] (or an owned
//! [`Image`]) through [`ImageColumn`], and built by [`ImageBuilder`],
//! pixels written straight into the column's values buffer.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, NullBufferBuilder, StructArray, UInt8Builder, UInt32Builder,
};
use arrow::buffer::{Buffer, ScalarBuffer};
use arrow::datatypes::UInt8Type;
use datafusion::error::Result;

use super::{image_fields, not_an};

/// One row of an image column.
#[derive(Debug, Clone, Copy)]
pub struct ImageRef<'a> {
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// Interleaved channels.
    pub channels: u8,
    /// `height * width * channels` bytes, row-major.
    pub pixels: &'a [u8],
}

/// A decoded image that owns its pixels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// Interleaved channels.
    pub channels: u8,
    /// `height * width * channels` bytes, row-major.
    pub pixels: Vec<u8>,
}

impl Image {
    /// A borrowed view.
    pub fn view(&self) -> ImageRef<'_> {
        ImageRef {
            height: self.height,
            width: self.width,
            channels: self.channels,
            pixels: &self.pixels,
        }
    }
}

/// Reads an image column's rows.
#[derive(Debug)]
pub struct ImageColumn<'a> {
    array: &'a StructArray,
    heights: &'a [u32],
    widths: &'a [u32],
    channels: &'a [u8],
    pixels: &'a arrow::array::LargeBinaryArray,
}

impl<'a> ImageColumn<'a> {
    /// Views `array`, which must be an image struct.
    pub fn new(array: &'a ArrayRef, udf: &str) -> Result<Self> {
        let Some(s) = array.as_struct_opt() else {
            return Err(not_an(udf, "image", array.data_type()));
        };
        if s.fields() != &image_fields() {
            return Err(not_an(udf, "image", array.data_type()));
        }
        Ok(Self {
            array: s,
            heights: s
                .column(0)
                .as_primitive::<arrow::datatypes::UInt32Type>()
                .values(),
            widths: s
                .column(1)
                .as_primitive::<arrow::datatypes::UInt32Type>()
                .values(),
            channels: s.column(2).as_primitive::<UInt8Type>().values(),
            pixels: s.column(3).as_binary::<i64>(),
        })
    }

    /// The pixels of all rows as one buffer, when no row is NULL and every
    /// row has exactly `size` bytes: then the values buffer already is a
    /// `[rows, size]` tensor and can be shared without a copy.
    pub fn contiguous(&self, size: usize) -> Option<Buffer> {
        if self.array.null_count() > 0 {
            return None;
        }
        let offsets = self.pixels.value_offsets();
        let uniform = offsets
            .windows(2)
            .all(|o| usize::try_from(o[1] - o[0]).ok() == Some(size));
        let start = usize::try_from(offsets[0]).ok()?;
        uniform.then(|| {
            self.pixels
                .values()
                .slice_with_length(start, size * self.array.len())
        })
    }

    /// Row `i`, or `None` when it is NULL.
    pub fn get(&self, i: usize) -> Option<ImageRef<'a>> {
        if self.array.is_null(i) {
            return None;
        }
        Some(ImageRef {
            height: self.heights[i],
            width: self.widths[i],
            channels: self.channels[i],
            pixels: self.pixels.value(i),
        })
    }
}

/// Builds an image column. Pixels are written straight into the column's
/// values buffer ([`ImageBuilder::try_append_with`]), never staged elsewhere.
#[derive(Debug)]
pub struct ImageBuilder {
    heights: UInt32Builder,
    widths: UInt32Builder,
    channels: UInt8Builder,
    offsets: Vec<i64>,
    values: Vec<u8>,
    nulls: NullBufferBuilder,
}

impl ImageBuilder {
    /// A builder for `rows` rows of about `bytes_per_row` pixels.
    pub fn with_capacity(rows: usize, bytes_per_row: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Self {
            heights: UInt32Builder::with_capacity(rows),
            widths: UInt32Builder::with_capacity(rows),
            channels: UInt8Builder::with_capacity(rows),
            offsets,
            values: Vec::with_capacity(rows.saturating_mul(bytes_per_row)),
            nulls: NullBufferBuilder::new(rows),
        }
    }

    fn push_row(&mut self, h: u32, w: u32, c: u8, valid: bool) {
        self.heights.append_value(h);
        self.widths.append_value(w);
        self.channels.append_value(c);
        self.offsets.push(self.values.len() as i64);
        self.nulls.append(valid);
    }

    /// Appends a copy of an image.
    pub fn append(&mut self, img: ImageRef<'_>) {
        self.values.extend_from_slice(img.pixels);
        self.push_row(img.height, img.width, img.channels, true);
    }

    /// Appends an `h`×`w`×`c` image that `fill` writes in place. When `fill`
    /// fails nothing is appended and its error is returned.
    pub fn try_append_with<E>(
        &mut self,
        h: u32,
        w: u32,
        c: u8,
        fill: impl FnOnce(&mut [u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let start = self.values.len();
        self.values
            .resize(start + h as usize * w as usize * usize::from(c), 0);
        if let Err(e) = fill(&mut self.values[start..]) {
            self.values.truncate(start);
            return Err(e);
        }
        self.push_row(h, w, c, true);
        Ok(())
    }

    /// Appends a NULL.
    pub fn append_null(&mut self) {
        self.push_row(0, 0, 0, false);
    }

    /// The column.
    pub fn finish(mut self) -> ArrayRef {
        let pixels = arrow::array::LargeBinaryArray::new(
            arrow::buffer::OffsetBuffer::new(ScalarBuffer::from(self.offsets)),
            Buffer::from_vec(self.values),
            None,
        );
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.heights.finish()),
            Arc::new(self.widths.finish()),
            Arc::new(self.channels.finish()),
            Arc::new(pixels),
        ];
        Arc::new(StructArray::new(
            image_fields(),
            columns,
            self.nulls.finish(),
        ))
    }
}
