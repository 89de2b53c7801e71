//! NumPy `.npz` archives (zip of `.npy` members, stored or deflated).

use std::io::{Cursor, Read};

use crate::env::Limits;
use crate::kernels::npy::{self, Parsed};

/// Reads member `name` (with or without `.npy`) of an `.npz` archive.
pub fn member<'a>(bytes: &'a [u8], name: &str, limits: &Limits) -> Result<Parsed<'a>, String> {
    if bytes.is_empty() {
        return Err("empty object".into());
    }
    let mut zip =
        zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| format!("not a .npz archive: {e}"))?;
    let file_name = if name.ends_with(".npy") {
        name.to_owned()
    } else {
        format!("{name}.npy")
    };
    let Some(index) = zip.index_for_name(&file_name) else {
        let names: Vec<String> = (0..zip.len())
            .filter_map(|i| {
                zip.name_for_index(i)
                    .and_then(|n| n.ok())
                    .map(|n| n.trim_end_matches(".npy").to_owned())
            })
            .collect();
        return Err(format!(
            "no array '{name}' in the archive (it has: {})",
            names.join(", ")
        ));
    };
    // A stored (uncompressed) member — what `np.savez` writes — is parsed
    // straight from the archive's bytes: no copy out of the zip, and no
    // second checksum pass (the whole object's crc32c was checked when it
    // was read from the device; the .npy header is checked against the
    // bytes present).
    {
        let raw = zip
            .by_index_raw(index)
            .map_err(|e| format!("cannot read '{file_name}': {e}"))?;
        if raw.compression() == zip::CompressionMethod::Stored && !raw.encrypted() {
            let len = raw.compressed_size();
            limits.check(&format!("npz member '{name}'"), 0, 0, len)?;
            let span = raw.data_start().and_then(|start| {
                let start = usize::try_from(start).ok()?;
                bytes.get(start..start.checked_add(usize::try_from(len).ok()?)?)
            });
            if let Some(data) = span {
                return npy::parse(data, limits).map_err(|e| format!("member '{name}': {e}"));
            }
        }
    }
    let mut entry = zip
        .by_index(index)
        .map_err(|e| format!("cannot read '{file_name}': {e}"))?;
    let claimed = entry.size();
    limits.check(&format!("npz member '{name}'"), 0, 0, claimed)?;
    // Never trust the claimed size: read at most the limit, plus one byte to notice.
    let mut buf = Vec::with_capacity(claimed as usize);
    (&mut entry)
        .take(limits.max_decoded_bytes + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot inflate '{file_name}': {e}"))?;
    if buf.len() as u64 > limits.max_decoded_bytes {
        return Err(format!(
            "npz member '{name}' inflates past max_decoded_bytes"
        ));
    }
    npy::parse(&buf, limits)
        .map(Parsed::into_owned)
        .map_err(|e| format!("member '{name}': {e}"))
}

/// Writes an `.npz` archive of `.npy` members (deflated when `compress`).
pub fn write(members: &[(&str, Vec<u8>)], compress: bool) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    let mut w = zip::ZipWriter::new(&mut out);
    let method = if compress {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    for (name, npy) in members {
        // Writing to a Vec cannot fail.
        if w.start_file(format!("{name}.npy"), opts).is_ok() {
            let _ = std::io::Write::write_all(&mut w, npy);
        }
    }
    let _ = w.finish();
    out.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::npy::DType;

    #[test]
    fn reads_members_and_names_missing_ones() {
        let a = npy::write(DType::U8, &[2, 2], &[1, 2, 3, 4]);
        let b = npy::write(DType::F32, &[1], &1.5f32.to_le_bytes());
        for compress in [false, true] {
            let z = write(&[("image", a.clone()), ("mask", b.clone())], compress);
            let l = Limits::default();
            assert_eq!(*member(&z, "image", &l).unwrap().data, [1, 2, 3, 4]);
            assert_eq!(member(&z, "mask.npy", &l).unwrap().dtype, DType::F32);
            let e = member(&z, "label", &l).unwrap_err();
            assert!(
                e.contains("no array 'label'") && e.contains("image, mask"),
                "{e}"
            );
        }
        assert!(
            member(b"not a zip", "x", &Limits::default())
                .unwrap_err()
                .contains("not a .npz")
        );
    }

    #[test]
    fn stored_members_are_bounded_and_checked_too() {
        let big = npy::write(DType::U8, &[1 << 16], &vec![7; 1 << 16]);
        let z = write(&[("x", big)], false);
        let tight = Limits {
            max_decoded_bytes: 1 << 10,
            ..Limits::default()
        };
        let e = member(&z, "x", &tight).unwrap_err();
        assert!(e.contains("max_decoded_bytes"), "{e}");
        // A header promising more elements than the member holds.
        let mut lying = npy::write(DType::U8, &[1 << 16], &vec![7; 1 << 16]);
        lying.truncate(lying.len() - 100);
        let z = write(&[("x", lying)], false);
        let e = member(&z, "x", &Limits::default()).unwrap_err();
        assert!(e.contains("member 'x'") && e.contains("truncated"), "{e}");
    }

    #[test]
    fn a_zip_bomb_stops_at_the_limit() {
        let big = npy::write(DType::U8, &[1 << 20], &vec![0; 1 << 20]);
        let z = write(&[("x", big)], true);
        assert!(z.len() < 1 << 14);
        let l = Limits {
            max_decoded_bytes: 1 << 16,
            ..Limits::default()
        };
        assert!(
            member(&z, "x", &l)
                .unwrap_err()
                .contains("max_decoded_bytes")
        );
    }
}
