//! Volumes: 3-D crops and trilinear resizing over an array's first three
//! dimensions; any further dimensions (channels) are carried along.

use crate::kernels::npy::DType;

/// Checks that `shape` has at least three dimensions; returns them and the
/// elements per voxel (the product of the rest).
pub fn dims(shape: &[u32]) -> Result<([usize; 3], usize), String> {
    if shape.len() < 3 {
        return Err(format!(
            "a volume needs at least 3 dimensions, got shape {shape:?}"
        ));
    }
    let rest: usize = shape[3..].iter().map(|&d| d as usize).product();
    Ok((
        [shape[0] as usize, shape[1] as usize, shape[2] as usize],
        rest,
    ))
}

/// Copies the box at `start` of size `size` (first three dimensions) of a
/// C-order array with element size `esize`. The box must lie inside.
pub fn crop3d(
    data: &[u8],
    shape: &[u32],
    esize: usize,
    start: [u32; 3],
    size: [u32; 3],
) -> Result<Vec<u8>, String> {
    let (d, rest) = dims(shape)?;
    for k in 0..3 {
        if start[k] as usize + size[k] as usize > d[k] {
            return Err(format!(
                "crop box {start:?}+{size:?} exceeds the volume's shape {shape:?}"
            ));
        }
    }
    let voxel = rest * esize;
    let run = size[2] as usize * voxel;
    let mut out = Vec::with_capacity(size.iter().map(|&s| s as usize).product::<usize>() * voxel);
    for z in 0..size[0] as usize {
        for y in 0..size[1] as usize {
            let src = (((start[0] as usize + z) * d[1] + start[1] as usize + y) * d[2]
                + start[2] as usize)
                * voxel;
            out.extend_from_slice(&data[src..src + run]);
        }
    }
    Ok(out)
}

/// Trilinear resize of the first three dimensions to `to`, as float32
/// (little-endian bytes), with align-corners=false sampling.
pub fn resize3d(data: &[u8], shape: &[u32], dtype: DType, to: [u32; 3]) -> Result<Vec<u8>, String> {
    let (d, rest) = dims(shape)?;
    if d.contains(&0) {
        return Err(format!("cannot resize an empty volume of shape {shape:?}"));
    }
    // Per-axis source index pairs and weights.
    let axis = |src: usize, dst: u32| -> Vec<(usize, usize, f32)> {
        let scale = src as f64 / f64::from(dst);
        (0..dst)
            .map(|i| {
                let x = ((f64::from(i) + 0.5) * scale - 0.5).max(0.0);
                let i0 = (x.floor() as usize).min(src - 1);
                let i1 = (i0 + 1).min(src - 1);
                (i0, i1, (x - i0 as f64) as f32)
            })
            .collect()
    };
    let (az, ay, ax) = (axis(d[0], to[0]), axis(d[1], to[1]), axis(d[2], to[2]));
    let at = |z: usize, y: usize, x: usize, c: usize| {
        dtype.get_f32(data, ((z * d[1] + y) * d[2] + x) * rest + c)
    };
    let n = to.iter().map(|&t| t as usize).product::<usize>() * rest;
    let mut out = Vec::with_capacity(n * 4);
    for &(z0, z1, wz) in &az {
        for &(y0, y1, wy) in &ay {
            for &(x0, x1, wx) in &ax {
                for c in 0..rest {
                    let lerp = |a: f32, b: f32, w: f32| a + (b - a) * w;
                    let p = |z| {
                        lerp(
                            lerp(at(z, y0, x0, c), at(z, y0, x1, c), wx),
                            lerp(at(z, y1, x0, c), at(z, y1, x1, c), wx),
                            wy,
                        )
                    };
                    out.extend_from_slice(&lerp(p(z0), p(z1), wz).to_le_bytes());
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crops_a_box_with_trailing_channels() {
        // 3x3x3 volume with 2 channels; value = 50*z + 10*y + x (+5 for channel 1).
        let mut data = Vec::new();
        for z in 0..3u8 {
            for y in 0..3u8 {
                for x in 0..3u8 {
                    data.extend([50 * z + 10 * y + x, 50 * z + 10 * y + x + 5]);
                }
            }
        }
        let out = crop3d(&data, &[3, 3, 3, 2], 1, [1, 1, 1], [2, 1, 2]).unwrap();
        assert_eq!(out, [61, 66, 62, 67, 111, 116, 112, 117]);
        assert!(
            crop3d(&data, &[3, 3, 3, 2], 1, [2, 0, 0], [2, 1, 1])
                .unwrap_err()
                .contains("exceeds")
        );
        assert!(
            crop3d(&data, &[9, 6], 1, [0, 0, 0], [1, 1, 1])
                .unwrap_err()
                .contains("3 dimensions")
        );
    }

    #[test]
    fn resizing_a_linear_ramp_keeps_it_linear() {
        let data: Vec<u8> = (0..4u8).flat_map(|z| [z * 10; 4]).collect(); // 4x2x2, ramp along z
        let out = resize3d(&data, &[4, 2, 2], DType::U8, [2, 1, 1]).unwrap();
        let vals: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(vals, [5.0, 25.0]);
    }
}
