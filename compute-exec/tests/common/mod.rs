//! What the integration tests of sharded datasets share: a source of
//! small `.npy` samples in three classes.

use std::path::Path;

use sluice_udfs::kernels::npy::{self, DType};

/// Samples in the source.
pub const SAMPLES: usize = 37;

/// Writes the source under `dir`: `c{i % 3}/v{i}.npy`, each a float32
/// pair `[i, 0.5]`.
pub fn write_samples(dir: &Path) {
    for i in 0..SAMPLES {
        let p = dir.join(format!("c{}/v{i:03}.npy", i % 3));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let data: Vec<u8> = [i as f32, 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        std::fs::write(p, npy::write(DType::F32, &[2], &data)).unwrap();
    }
}
