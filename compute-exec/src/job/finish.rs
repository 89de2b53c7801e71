//! A job's last elementwise stage, run as its batches are written out.
//!
//! ```text
//!  SQL outputs:   key, normalize(crop(decode(data)), mean, std) AS image
//!  window plan:   key, crop(decode(data)) AS image          (uint8 rows)
//!  delivery:      each batch's `image` normalized straight into the
//!                 trainer's slot (or the Flight message), in epoch order
//! ```
//!
//! `normalize` reads a byte a value and writes four. As a stage of the
//! plan it makes a float batch per window, which the delivery then copies
//! into the trainer's shared-memory slot; windows held for reordering,
//! the output cache and any storage→compute link carry the floats. When
//! an output is a `normalize` that cannot fail on any row
//! ([`sluice_udfs::udf::NormalizeRows::of`]: literal statistics that fit
//! an input of one fixed size), the job plans the window without it and
//! delivers the column as a finished column ([`sluice_flight::finish`]):
//! the floats are written once, where the trainer reads them, and
//! everything before holds the bytes. The values are those of the
//! stage (same kernel, same table per channel): placement transparency
//! holds, and `tests/python/test_shm.py` checks it against the query.
//! It times itself into the job's stage clock, as a compute-side stage:
//! the job's status shows it where it was.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::ArrayRef;
use arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use datafusion::logical_expr::Expr;
use sluice_flight::finish::Finish;
use sluice_flight::gather::Finishes;
use sluice_udfs::udf::{Function, Normalize, NormalizeRows};
use sluice_udfs::{Site, StageClock};

/// A job's outputs with their last stage taken out where it can be.
#[derive(Debug)]
pub struct Deferred {
    /// The outputs the window plan computes (a deferred output is its
    /// stage's input, under the output's name).
    pub exprs: Vec<Expr>,
    /// Each output's finish (`None`: none deferred).
    pub finishes: Option<Finishes>,
}

/// Defers the last stage of each output of `exprs` (the pipeline's
/// projection, over `input`, named as `schema`) that can be; a deferred
/// stage times itself into `clock` (the job's, as its UDFs do).
pub fn defer(
    exprs: &[Expr],
    input: &DFSchema,
    schema: &DFSchema,
    clock: &Arc<StageClock>,
) -> Deferred {
    let mut out = Vec::with_capacity(exprs.len());
    let mut finishes: Vec<Option<Arc<dyn Finish>>> = Vec::with_capacity(exprs.len());
    for (i, e) in exprs.iter().enumerate() {
        match NormalizeRows::of(e, input) {
            Some((arg, rows)) => {
                let (qualifier, field) = schema.qualified_field(i);
                out.push(arg.alias_qualified(qualifier.cloned(), field.name()));
                finishes.push(Some(Arc::new(NormalizeFinish {
                    rows,
                    clock: Arc::clone(clock),
                })));
            }
            None => {
                out.push(e.clone());
                finishes.push(None);
            }
        }
    }
    let finishes = finishes
        .iter()
        .any(Option::is_some)
        .then(|| Finishes::from(finishes));
    Deferred {
        exprs: out,
        finishes,
    }
}

/// `normalize` as a [`Finish`]: float32 rows.
#[derive(Debug)]
struct NormalizeFinish {
    rows: NormalizeRows,
    clock: Arc<StageClock>,
}

impl Finish for NormalizeFinish {
    fn row_bytes(&self) -> usize {
        self.rows.row_elements() * 4
    }

    fn write(&self, source: &ArrayRef, start: usize, len: usize, out: &mut [u8]) {
        let began = Instant::now();
        self.write_untimed(source, start, len, out);
        let ns = u64::try_from(began.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // On the compute side, as the stage was.
        let stage = <Normalize as Function>::SPEC.name;
        self.clock.record(&Site::default(), stage, len as u64, ns);
    }

    fn describe(&self, input: &str) -> String {
        self.rows.describe(input)
    }
}

/// The finished columns of `schema` and their stages, a line each, as
/// EXPLAIN shows them ("at delivery").
pub fn describe(schema: &SchemaRef, finishes: Option<&Finishes>) -> Vec<String> {
    let Some(finishes) = finishes else {
        return Vec::new();
    };
    schema
        .fields()
        .iter()
        .zip(finishes.iter())
        .filter_map(|(field, f)| {
            let name = field.name();
            f.as_ref()
                .map(|f| format!("{name} = {}", f.describe(&format!("the window's {name}"))))
        })
        .collect()
}

impl NormalizeFinish {
    fn write_untimed(&self, source: &ArrayRef, start: usize, len: usize, out: &mut [u8]) {
        // SAFETY: every bit pattern is a valid `f32`, and `align_to_mut`
        // hands out only the part of `out` that is aligned for one.
        let (head, floats, tail) = unsafe { out.align_to_mut::<f32>() };
        if head.is_empty() && tail.is_empty() {
            self.rows.write(source, start, len, floats);
            return;
        }
        // A body placed off a 4-byte boundary (no slot or message is, the
        // IPC body is 8-aligned): write through an aligned buffer.
        let mut aligned = vec![0f32; out.len() / 4];
        self.rows.write(source, start, len, &mut aligned);
        for (o, v) in out.chunks_exact_mut(4).zip(aligned) {
            o.copy_from_slice(&v.to_ne_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::prelude::col;
    use sluice_udfs::tensor::{ImageBuilder, ImageRef};

    use super::*;

    /// Two 2×2 RGB images, then a NULL row.
    fn images() -> ArrayRef {
        let mut b = ImageBuilder::with_capacity(3, 12);
        for v in [10u8, 200] {
            let pixels: Vec<u8> = (0..12).map(|i| v.wrapping_add(i)).collect();
            b.append(ImageRef {
                height: 2,
                width: 2,
                channels: 3,
                pixels: &pixels,
            });
        }
        b.append_null();
        b.finish()
    }

    fn finish(clock: &Arc<StageClock>) -> NormalizeFinish {
        let rows =
            NormalizeRows::new(vec![0.5, 0.4, 0.3], vec![0.2, 0.25, 0.3], [2, 2, 3]).unwrap();
        NormalizeFinish {
            rows,
            clock: Arc::clone(clock),
        }
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_finish_writes_the_stages_floats_aligned_or_not_and_times_itself() {
        let clock = Arc::new(StageClock::default());
        let f = finish(&clock);
        assert_eq!(f.row_bytes(), 48);
        let source = images();
        // The kernel's own floats, the reference.
        let mut want = vec![0f32; 36];
        f.rows.write(&source, 0, 3, &mut want);
        assert!(want[24..].iter().all(|&v| v == 0.0), "a NULL row is zeros");
        assert!((want[0] - ((10.0 / 255.0 - 0.5) / 0.2) as f32).abs() < 1e-5);

        // An aligned body and one a byte off a 4-byte boundary get the
        // same values.
        let mut words = [0u32; 37];
        // SAFETY: a `u32` buffer viewed as its bytes, every one initialized.
        let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), 148) };
        f.write(&source, 0, 3, &mut bytes[..144]);
        assert_eq!(floats(&bytes[..144]), want);
        f.write(&source, 0, 3, &mut bytes[1..145]);
        assert_eq!(floats(&bytes[1..145]), want);
        // Rows from an offset: the second image alone.
        let mut one = vec![0u8; 48];
        f.write(&source, 1, 1, &mut one);
        assert_eq!(floats(&one), want[12..24]);

        let timed = clock.snapshot();
        assert_eq!(timed.len(), 1, "{timed:?}");
        assert_eq!(timed[0].udf, "normalize");
        assert_eq!(timed[0].tally.rows, 7);
        assert_eq!(timed[0].site, Site::default());
    }

    #[test]
    fn only_deferred_outputs_are_described_and_none_when_nothing_is() {
        let clock = Arc::new(StageClock::default());
        let f: Arc<dyn Finish> = Arc::new(finish(&clock));
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("image", DataType::Binary, true),
        ]));
        let finishes = Finishes::from(vec![None, Some(f)]);
        assert_eq!(
            describe(&schema, Some(&finishes)),
            ["image = normalize(the window's image, [0.5, 0.4, 0.3], [0.2, 0.25, 0.3])"]
        );
        assert!(describe(&schema, None).is_empty());

        // An output that is no `normalize` is left as it is.
        let input = DFSchema::try_from(schema.as_ref().clone()).unwrap();
        let exprs = [col("key"), col("image")];
        let d = defer(&exprs, &input, &input, &clock);
        assert_eq!(d.exprs, exprs);
        assert!(d.finishes.is_none());
    }
}
