//! `sluice gen-sample DIR`: a small generated ImageFolder dataset.
//!
//! Classes `class_0 … class_{n-1}`, each with JPEG and PNG images of varied
//! sizes whose pixels are a seeded pattern, so the demo and the tests have
//! real, decodable images without downloading anything.

use std::path::Path;

use anyhow::Context;

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

pub fn run(dir: &Path, classes: u32, per_class: u32, seed: u64) -> anyhow::Result<()> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut count = 0;
    for c in 0..classes {
        let class_dir = dir.join(format!("class_{c}"));
        std::fs::create_dir_all(&class_dir)
            .with_context(|| format!("create {}", class_dir.display()))?;
        for i in 0..per_class {
            let w = 64 + (rng.next() % 448) as u32;
            let h = 64 + (rng.next() % 448) as u32;
            let (a, b) = ((rng.next() % 256) as u8, (rng.next() % 256) as u8);
            let img = image::RgbImage::from_fn(w, h, |x, y| {
                image::Rgb([
                    (x as u8).wrapping_add(a),
                    (y as u8).wrapping_add(b),
                    ((x ^ y) as u8).wrapping_mul(c as u8 + 1),
                ])
            });
            let (ext, format) = if i % 4 == 3 {
                ("png", image::ImageFormat::Png)
            } else {
                ("jpg", image::ImageFormat::Jpeg)
            };
            let path = class_dir.join(format!("img_{i:05}.{ext}"));
            img.save_with_format(&path, format)
                .with_context(|| format!("write {}", path.display()))?;
            count += 1;
        }
    }
    println!(
        "wrote {count} images in {classes} classes to {}",
        dir.display()
    );
    Ok(())
}
