//! NumPy `.npy` parsing: header, dtype, shape; data to little-endian C order.

use crate::env::Limits;

/// Element types sluice reads from `.npy` files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// bool (one byte).
    Bool,
    /// uint8.
    U8,
    /// int8.
    I8,
    /// uint16.
    U16,
    /// int16.
    I16,
    /// uint32.
    U32,
    /// int32.
    I32,
    /// uint64.
    U64,
    /// int64.
    I64,
    /// float16.
    F16,
    /// float32.
    F32,
    /// float64.
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::Bool | Self::U8 | Self::I8 => 1,
            Self::U16 | Self::I16 | Self::F16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }

    /// NumPy's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bool => "bool",
            Self::U8 => "uint8",
            Self::I8 => "int8",
            Self::U16 => "uint16",
            Self::I16 => "int16",
            Self::U32 => "uint32",
            Self::I32 => "int32",
            Self::U64 => "uint64",
            Self::I64 => "int64",
            Self::F16 => "float16",
            Self::F32 => "float32",
            Self::F64 => "float64",
        }
    }

    /// From NumPy's name.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::Bool,
            Self::U8,
            Self::I8,
            Self::U16,
            Self::I16,
            Self::U32,
            Self::I32,
            Self::U64,
            Self::I64,
            Self::F16,
            Self::F32,
            Self::F64,
        ]
        .into_iter()
        .find(|d| d.name() == name)
    }

    /// Parses a descr such as `<f4`; returns the type and whether it is big-endian.
    fn from_descr(descr: &str) -> Result<(Self, bool), String> {
        let unsupported = || {
            let shown: String = descr.chars().take(64).collect();
            format!("unsupported dtype '{shown}'")
        };
        // By character: the header is text and its first one may be
        // multi-byte (found by the `arrays` and `probe` fuzz targets).
        let mut chars = descr.chars();
        let order = chars.next();
        let code = chars.as_str();
        let big = match order {
            Some('<' | '|' | '=') => false,
            Some('>') => true,
            _ => return Err(unsupported()),
        };
        let t = match code {
            "b1" => Self::Bool,
            "u1" => Self::U8,
            "i1" => Self::I8,
            "u2" => Self::U16,
            "i2" => Self::I16,
            "u4" => Self::U32,
            "i4" => Self::I32,
            "u8" => Self::U64,
            "i8" => Self::I64,
            "f2" => Self::F16,
            "f4" => Self::F32,
            "f8" => Self::F64,
            _ => return Err(unsupported()),
        };
        Ok((t, big))
    }

    /// Element `i` of little-endian `data` as f32.
    pub fn get_f32(self, data: &[u8], i: usize) -> f32 {
        let s = self.size();
        let b = &data[i * s..(i + 1) * s];
        match self {
            Self::Bool | Self::U8 => f32::from(b[0]),
            Self::I8 => f32::from(b[0] as i8),
            Self::U16 => f32::from(u16::from_le_bytes([b[0], b[1]])),
            Self::I16 => f32::from(i16::from_le_bytes([b[0], b[1]])),
            Self::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            Self::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
            Self::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
            Self::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Self::U64 => u64::from_le_bytes(b.try_into().unwrap_or_default()) as f32,
            Self::I64 => i64::from_le_bytes(b.try_into().unwrap_or_default()) as f32,
            Self::F64 => f64::from_le_bytes(b.try_into().unwrap_or_default()) as f32,
        }
    }
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let frac = u32::from(h & 0x3ff);
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: renormalise.
            let mut e = 127 - 15 + 1;
            let mut f = f;
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((f & 0x3ff) << 13)
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 127 - 15) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

/// A parsed array: type, shape, and its elements little-endian in C order
/// (borrowed from the file when it holds them so, made otherwise).
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u32>,
    /// Elements.
    pub data: std::borrow::Cow<'a, [u8]>,
}

impl Parsed<'_> {
    /// The same array, owning its elements.
    pub fn into_owned(self) -> Parsed<'static> {
        Parsed {
            dtype: self.dtype,
            shape: self.shape,
            data: std::borrow::Cow::Owned(self.data.into_owned()),
        }
    }
}

/// What the header says, without the data.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// Element type.
    pub dtype: DType,
    /// Big-endian elements.
    pub big_endian: bool,
    /// Fortran (column-major) order.
    pub fortran: bool,
    /// Dimensions.
    pub shape: Vec<u32>,
    /// Offset of the data.
    pub data_offset: usize,
}

impl Header {
    /// Elements in the array.
    pub fn elements(&self) -> u64 {
        self.shape.iter().map(|&d| u64::from(d)).product()
    }
}

/// Parses the header of a `.npy` file.
pub fn header(bytes: &[u8]) -> Result<Header, String> {
    if bytes.is_empty() {
        return Err("empty object".into());
    }
    if !bytes.starts_with(b"\x93NUMPY") || bytes.len() < 10 {
        return Err(format!(
            "not a .npy file (first bytes: {})",
            crate::kernels::decode::first_bytes(bytes)
        ));
    }
    let (len, start) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let text = bytes
        .get(start..start + len)
        .ok_or("truncated .npy header")?;
    let text = std::str::from_utf8(text).map_err(|_| "the .npy header is not text")?;
    let descr = dict_value(text, "descr").ok_or("the .npy header has no descr")?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    let (dtype, big_endian) = DType::from_descr(descr)?;
    let fortran =
        dict_value(text, "fortran_order").ok_or("the .npy header has no fortran_order")? == "True";
    let shape_text = dict_value(text, "shape").ok_or("the .npy header has no shape")?;
    let shape = shape_text
        .trim_matches(|c| c == '(' || c == ')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|d| {
            d.parse::<u32>()
                .map_err(|_| format!("bad dimension '{d}' in shape {shape_text}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Header {
        dtype,
        big_endian,
        fortran,
        shape,
        data_offset: start + len,
    })
}

/// The text of `key`'s value in a Python dict literal (`'key': value`).
fn dict_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let at = text.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')')? + 1
    } else {
        rest.find([',', '}']).unwrap_or(rest.len())
    };
    Some(rest[..end].trim())
}

/// Parses a `.npy` file, checking its size against `limits` before copying.
pub fn parse<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Parsed<'a>, String> {
    let h = header(bytes)?;
    let n = h.elements();
    let size = n * h.dtype.size() as u64;
    limits.check(&format!("array {:?}", h.shape), 0, 0, size)?;
    let data = bytes
        .get(h.data_offset..)
        .filter(|d| d.len() as u64 >= size)
        .ok_or_else(|| {
            format!(
                "truncated .npy data: shape {:?} of {} needs {size} bytes, {} present",
                h.shape,
                h.dtype.name(),
                bytes.len().saturating_sub(h.data_offset)
            )
        })?;
    let mut data = std::borrow::Cow::Borrowed(&data[..size as usize]);
    if h.big_endian && h.dtype.size() > 1 {
        data.to_mut()
            .chunks_exact_mut(h.dtype.size())
            .for_each(<[u8]>::reverse);
    }
    if h.fortran && h.shape.len() > 1 {
        data = std::borrow::Cow::Owned(fortran_to_c(&data, &h.shape, h.dtype.size()));
    }
    Ok(Parsed {
        dtype: h.dtype,
        shape: h.shape,
        data,
    })
}

/// Reorders a column-major array of `shape` into row-major.
fn fortran_to_c(data: &[u8], shape: &[u32], esize: usize) -> Vec<u8> {
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let n: usize = dims.iter().product();
    // Fortran strides (in elements): 1, d0, d0*d1, …
    let mut fstride = vec![1usize; dims.len()];
    for i in 1..dims.len() {
        fstride[i] = fstride[i - 1] * dims[i - 1];
    }
    let mut out = vec![0u8; n * esize];
    let mut idx = vec![0usize; dims.len()];
    for c in 0..n {
        let f: usize = idx.iter().zip(&fstride).map(|(i, s)| i * s).sum();
        out[c * esize..(c + 1) * esize].copy_from_slice(&data[f * esize..(f + 1) * esize]);
        // Next C-order index: the last dimension moves fastest.
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// Writes a `.npy` file (version 1, little-endian, C order).
pub fn write(dtype: DType, shape: &[u32], data: &[u8]) -> Vec<u8> {
    let descr = match dtype {
        DType::Bool => "|b1".to_owned(),
        DType::U8 => "|u1".to_owned(),
        DType::I8 => "|i1".to_owned(),
        d => {
            let code = match d {
                DType::U16 | DType::U32 | DType::U64 => 'u',
                DType::I16 | DType::I32 | DType::I64 => 'i',
                _ => 'f',
            };
            format!("<{code}{}", d.size())
        }
    };
    let dims: Vec<String> = shape.iter().map(u32::to_string).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descr_starting_with_a_multibyte_character_is_an_error() {
        // Found by the `arrays` and `probe` fuzz targets: slicing the
        // descr's first byte panicked inside a two-byte character.
        for descr in ["\u{67a}f4", "\u{743}u1"] {
            let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (1,), }}");
            let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
            bytes.extend((header.len() as u16).to_le_bytes());
            bytes.extend(header.as_bytes());
            let e = parse(&bytes, &Limits::default()).unwrap_err();
            assert!(e.contains("unsupported dtype") && e.contains(descr), "{e}");
        }
        assert!(DType::from_descr("").is_err());
    }

    #[test]
    fn round_trips_and_reads_numpy_spellings() {
        let data: Vec<u8> = (0..24u8).collect();
        let file = write(DType::U16, &[2, 3, 2], &data);
        let p = parse(&file, &Limits::default()).unwrap();
        assert_eq!(
            (p.dtype, p.shape.clone(), p.data.to_vec()),
            (DType::U16, vec![2, 3, 2], data)
        );
        // Little-endian C order is the file's own bytes, not a copy.
        assert!(matches!(p.data, std::borrow::Cow::Borrowed(_)));
        // NumPy's own header for a 0-d and a 1-d array.
        let h = header(&write(DType::F32, &[], &[0; 4])).unwrap();
        assert!(h.shape.is_empty());
        assert_eq!(
            header(&write(DType::I64, &[7], &[0; 56])).unwrap().shape,
            vec![7]
        );
    }

    #[test]
    fn big_endian_and_fortran_order_become_little_endian_c_order() {
        let mut file = write(DType::U16, &[2, 3], &[0; 12]);
        let hdr_end = file.len() - 12;
        // Replace the descr and order, keeping the header length.
        let text = String::from_utf8(file[10..hdr_end].to_vec()).unwrap();
        let text = text.replace("'<u2'", "'>u2'").replace("False", "True ");
        file[10..hdr_end].copy_from_slice(text.as_bytes());
        // Column-major 2x3 of [[1,2,3],[4,5,6]] is 1,4,2,5,3,6, big-endian.
        for (i, v) in [1u16, 4, 2, 5, 3, 6].iter().enumerate() {
            file[hdr_end + 2 * i..hdr_end + 2 * i + 2].copy_from_slice(&v.to_be_bytes());
        }
        let p = parse(&file, &Limits::default()).unwrap();
        let vals: Vec<u16> = p
            .data
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(vals, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        let l = Limits::default();
        assert!(
            parse(b"PK\x03\x04zip", &l)
                .unwrap_err()
                .contains("not a .npy file")
        );
        let file = write(DType::F32, &[10, 10], &[0; 400]);
        assert!(
            parse(&file[..200], &l)
                .unwrap_err()
                .contains("truncated .npy data")
        );
        let huge = write(DType::F64, &[100000, 100000, 100], &[]);
        assert!(parse(&huge, &l).unwrap_err().contains("max_decoded_bytes"));
        assert!(f16_to_f32(0x3c00) == 1.0 && f16_to_f32(0xc000) == -2.0);
    }
}
