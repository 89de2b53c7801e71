//! Printing query results: aligned table, CSV, JSON lines, or an Arrow IPC stream.
//!
//! In the text formats, binary columns (such as `data`) are printed as their
//! byte length unless `--binary hex|base64` asks for the bytes, and images,
//! arrays and tensors as a one-line summary (`image 224x224x3`, `tensor
//! uint8 [224, 224, 3]`); `--format arrow` carries them whole, with their
//! extension types.

use std::io::Write;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringBuilder, UInt64Builder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;

use crate::cli::{BinaryFormat, RowFormat};

fn render_binary(col: &ArrayRef, mode: BinaryFormat) -> Option<(DataType, ArrayRef)> {
    let values: Vec<Option<&[u8]>> = match col.data_type() {
        DataType::Binary => col.as_binary::<i32>().iter().collect(),
        DataType::LargeBinary => col.as_binary::<i64>().iter().collect(),
        DataType::BinaryView => col.as_binary_view().iter().collect(),
        _ => return None,
    };
    Some(match mode {
        BinaryFormat::Length => {
            let mut b = UInt64Builder::with_capacity(values.len());
            values
                .iter()
                .for_each(|v| b.append_option(v.map(|v| v.len() as u64)));
            (DataType::UInt64, Arc::new(b.finish()))
        }
        BinaryFormat::Hex | BinaryFormat::Base64 => {
            let mut b = StringBuilder::new();
            for v in values {
                b.append_option(v.map(|v| match mode {
                    BinaryFormat::Hex => hex(v),
                    _ => base64(v),
                }));
            }
            (DataType::Utf8, Arc::new(b.finish()))
        }
    })
}

/// Lower-case hex, two digits a byte.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// Standard base64 with padding.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One-line summaries of image, array and tensor columns.
fn render_nested(field: &Field, col: &ArrayRef) -> Option<ArrayRef> {
    let summary: Box<dyn Fn(usize) -> String> = if sluice_udfs::tensor::is_image(field) {
        let s = col.as_struct();
        let (h, w, c) = (
            s.column(0)
                .as_primitive::<arrow::datatypes::UInt32Type>()
                .clone(),
            s.column(1)
                .as_primitive::<arrow::datatypes::UInt32Type>()
                .clone(),
            s.column(2)
                .as_primitive::<arrow::datatypes::UInt8Type>()
                .clone(),
        );
        Box::new(move |i| format!("image {}x{}x{}", h.value(i), w.value(i), c.value(i)))
    } else if sluice_udfs::tensor::is_array(field) {
        let s = col.as_struct();
        let (dtype, shape) = (
            s.column(0).as_string::<i32>().clone(),
            s.column(1).as_list::<i32>().clone(),
        );
        Box::new(move |i| {
            let dims = shape.value(i);
            let dims = dims.as_primitive::<arrow::datatypes::UInt32Type>();
            format!("array {} {:?}", dtype.value(i), dims.values())
        })
    } else if let Some(shape) = sluice_udfs::tensor::tensor_shape(field) {
        let DataType::FixedSizeList(item, _) = field.data_type() else {
            return None;
        };
        let text = format!(
            "tensor {} {shape:?}",
            item.data_type().to_string().to_lowercase()
        );
        Box::new(move |_| text.clone())
    } else {
        return None;
    };
    let mut b = StringBuilder::new();
    for i in 0..col.len() {
        b.append_option((!col.is_null(i)).then(|| summary(i)));
    }
    Some(Arc::new(b.finish()))
}

/// Replaces binary, image, array and tensor columns by their printable form.
pub fn printable(batch: &RecordBatch, mode: BinaryFormat) -> Result<RecordBatch, ArrowError> {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (f, col) in batch.schema().fields().iter().zip(batch.columns()) {
        if let Some(c) = render_nested(f, col) {
            fields.push(Field::new(f.name(), DataType::Utf8, true));
            columns.push(c);
            continue;
        }
        match render_binary(col, mode) {
            Some((dt, c)) => {
                fields.push(Field::new(f.name(), dt, f.is_nullable()));
                columns.push(c);
            }
            None => {
                fields.push(f.as_ref().clone());
                columns.push(Arc::clone(col));
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// Writes `batches` (with `schema`, for empty results) to stdout.
pub fn print_batches(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    format: RowFormat,
    binary: BinaryFormat,
) -> anyhow::Result<()> {
    let raw = batches;
    if format == RowFormat::Arrow {
        return write_ipc(schema, raw);
    }
    let batches: Vec<RecordBatch> = if batches.is_empty() {
        vec![RecordBatch::new_empty(Arc::clone(schema))]
    } else {
        batches.to_vec()
    };
    let batches = batches
        .iter()
        .map(|b| printable(b, binary))
        .collect::<Result<Vec<_>, _>>()?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match format {
        RowFormat::Table => {
            writeln!(
                out,
                "{}",
                arrow::util::pretty::pretty_format_batches(&batches)?
            )?;
        }
        RowFormat::Csv => {
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut out);
            for b in &batches {
                w.write(b)?;
            }
        }
        RowFormat::Arrow => return write_ipc(schema, raw),
        RowFormat::Json => {
            let mut w = arrow::json::WriterBuilder::new()
                .with_explicit_nulls(true)
                .build::<_, arrow::json::writer::LineDelimited>(&mut out);
            for b in &batches {
                w.write(b)?;
            }
            w.finish()?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Writes an Arrow IPC stream to stdout. The schema is the first batch's
/// (which carries the field metadata of extension types) or `schema`.
fn write_ipc(schema: &SchemaRef, batches: &[RecordBatch]) -> anyhow::Result<()> {
    let schema = batches
        .first()
        .map_or_else(|| Arc::clone(schema), RecordBatch::schema);
    let stdout = std::io::stdout();
    let mut w = arrow::ipc::writer::StreamWriter::try_new(stdout.lock(), &schema)?;
    for b in batches {
        w.write(&b.clone().with_schema(Arc::clone(&schema))?)?;
    }
    w.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::BinaryArray;

    #[test]
    fn binary_columns_print_as_length_hex_or_base64() {
        let col: ArrayRef = Arc::new(BinaryArray::from(vec![
            Some(b"hi!" as &[u8]),
            None,
            Some(b"\x00\xff"),
        ]));
        let batch = RecordBatch::try_from_iter([("data", col)]).unwrap();
        let len = printable(&batch, BinaryFormat::Length).unwrap();
        assert_eq!(
            len.column(0)
                .as_primitive::<arrow::datatypes::UInt64Type>()
                .value(0),
            3
        );
        assert!(len.column(0).is_null(1));
        let hex = printable(&batch, BinaryFormat::Hex).unwrap();
        assert_eq!(hex.column(0).as_string::<i32>().value(2), "00ff");
        let b64 = printable(&batch, BinaryFormat::Base64).unwrap();
        assert_eq!(b64.column(0).as_string::<i32>().value(0), "aGkh");
        assert_eq!(base64(b"\x00\xff"), "AP8=");
        assert_eq!(base64(b"a"), "YQ==");
    }
}
