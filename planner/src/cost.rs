//! The cost model: per sample, what a cut costs each side and the link.
//!
//! For every sampled object, the projection's expressions are evaluated
//! symbolically: a column of the scan has the object's statistics (`data`)
//! or its type's width; a sluice UDF call maps its input's statistics to its
//! result's through the UDF's own estimate and turns its work into
//! nanoseconds through its [`Profile`](sluice_udfs::cost::Profile). Under a
//! cut, storage pays the read, its sub-expressions and the encoding of what
//! it ships; compute pays the decoding and the rest; the link carries the
//! shipped columns. What the pipeline hands the trainer (`out_bytes`) is
//! costed too: [`Rates::of`](crate::choose::Rates::of) charges the socket
//! work of the link and of the trainer's stream, which depends on where the
//! sides run, not on the cut.

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::Expr;
use sluice_udfs::args::Consts;
use sluice_udfs::cost::{Profiles, SampleStats};

use crate::pipeline::{Cut, DATA_COLUMN as DATA, Pipeline, SHIPPED, is_stage};

/// CPU a storage node spends per object read (request, checksum setup).
pub const READ_NS_PER_SAMPLE: f64 = 2_000.0;
/// CPU a storage node spends per byte read (crc32c check, batch building).
pub const READ_NS_PER_BYTE: f64 = 0.25;
/// CPU per byte shipped, paid on each side (Flight encoding, decoding).
pub const LINK_NS_PER_BYTE: f64 = 0.15;
/// CPU per byte through a TCP socket, paid on each side: the kernel's
/// copies, HTTP/2 framing and the Flight encoding. Fitted to the rig's grid
/// (`scripts/bench_placement.py`: the small-JPEG cells, whose samples grow
/// 12x between the object and the tensor, put it at 1.5-1.9 ns per byte on
/// each side of a veth link); the in-process [`LINK_NS_PER_BYTE`] alone was
/// 10x short of what a real link costs.
pub const NET_NS_PER_BYTE: f64 = 1.6;
/// Bytes per shipped row besides its values (offsets, validity, framing).
pub const LINK_BYTES_PER_ROW: f64 = 16.0;

/// Per-sample cost of one cut for one object.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SampleCost {
    /// Storage CPU, ns.
    pub storage_ns: f64,
    /// Bytes over the link.
    pub link_bytes: f64,
    /// Compute CPU, ns.
    pub compute_ns: f64,
    /// Bytes handed to the trainer.
    pub out_bytes: f64,
}

impl std::ops::AddAssign for SampleCost {
    fn add_assign(&mut self, o: Self) {
        self.storage_ns += o.storage_ns;
        self.link_bytes += o.link_bytes;
        self.compute_ns += o.compute_ns;
        self.out_bytes += o.out_bytes;
    }
}

/// Costs cuts of one pipeline.
#[derive(Debug)]
pub struct CostModel<'a> {
    profiles: &'a Profiles,
    schema: SchemaRef,
    reads_data: bool,
}

impl<'a> CostModel<'a> {
    /// A model of `pipeline` under `profiles`.
    pub fn new(pipeline: &Pipeline, profiles: &'a Profiles) -> Self {
        let schema = pipeline.scan.projected_schema.inner().clone();
        let reads_data = pipeline
            .scan
            .projected_schema
            .fields()
            .iter()
            .any(|f| f.name() == DATA);
        Self {
            profiles,
            schema,
            reads_data,
        }
    }

    /// The cost of `cut` for an object described by `object`.
    pub fn sample(&self, cut: &Cut, object: &SampleStats) -> SampleCost {
        let mut storage_ns = if self.reads_data {
            READ_NS_PER_SAMPLE + READ_NS_PER_BYTE * object.bytes
        } else {
            READ_NS_PER_SAMPLE
        };
        let mut link_bytes = LINK_BYTES_PER_ROW;
        let mut shipped = Vec::with_capacity(cut.shipped.len());
        for e in &cut.shipped {
            let v = self.eval(e, object, &[]);
            storage_ns += v.ns;
            link_bytes += v.stats.bytes;
            shipped.push(v.stats);
        }
        storage_ns += LINK_NS_PER_BYTE * link_bytes;
        let mut compute_ns = LINK_NS_PER_BYTE * link_bytes;
        let mut out_bytes = LINK_BYTES_PER_ROW;
        for e in &cut.compute {
            let v = self.eval(e, object, &shipped);
            compute_ns += v.ns;
            out_bytes += v.stats.bytes;
        }
        SampleCost {
            storage_ns,
            link_bytes,
            compute_ns,
            out_bytes,
        }
    }

    fn column(&self, name: &str, object: &SampleStats, shipped: &[SampleStats]) -> SampleStats {
        if let Some(i) = name
            .strip_prefix(SHIPPED)
            .and_then(|i| i.parse::<usize>().ok())
            && let Some(s) = shipped.get(i)
        {
            return *s;
        }
        if name == DATA {
            return *object;
        }
        let bytes = match self.schema.field_with_name(name).map(|f| f.data_type()) {
            Ok(t) => type_bytes(t),
            Err(_) => 8.0,
        };
        SampleStats {
            bytes,
            ..SampleStats::default()
        }
    }

    fn eval(&self, e: &Expr, object: &SampleStats, shipped: &[SampleStats]) -> Value {
        match e {
            Expr::Column(c) => Value {
                stats: self.column(&c.name, object, shipped),
                ns: 0.0,
            },
            Expr::Literal(..) => Value::default(),
            Expr::Alias(a) => self.eval(&a.expr, object, shipped),
            Expr::ScalarFunction(f) if is_stage(f.func.name()) => {
                let args: Vec<Value> = f
                    .args
                    .iter()
                    .map(|a| self.eval(a, object, shipped))
                    .collect();
                let below: f64 = args.iter().map(|a| a.ns).sum();
                let input = args.first().map(|a| a.stats).unwrap_or_default();
                let Some(spec) = sluice_udfs::udf::spec(f.func.name()) else {
                    return Value {
                        stats: input,
                        ns: below,
                    };
                };
                let literals = f
                    .args
                    .iter()
                    .map(|a| match a {
                        Expr::Literal(v, _) => Some(v.clone()),
                        _ => None::<ScalarValue>,
                    })
                    .collect();
                let consts = Consts::from_values(spec, literals);
                match sluice_udfs::udf::estimate(&f.func, &consts, &input) {
                    Some(Ok(est)) => {
                        let ns = self
                            .profiles
                            .get(f.func.name())
                            .map_or(0.0, |p| p.ns(est.work));
                        Value {
                            stats: est.out,
                            ns: below + ns,
                        }
                    }
                    _ => Value {
                        stats: input,
                        ns: below,
                    },
                }
            }
            other => {
                let mut ns = 0.0;
                let mut bytes: f64 = 0.0;
                let _ = other.apply_children(|c| {
                    let v = self.eval(c, object, shipped);
                    ns += v.ns;
                    bytes = bytes.max(v.stats.bytes);
                    Ok(TreeNodeRecursion::Continue)
                });
                Value {
                    stats: SampleStats {
                        bytes: bytes.max(8.0),
                        ..SampleStats::default()
                    },
                    ns,
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Value {
    stats: SampleStats,
    ns: f64,
}

fn type_bytes(t: &DataType) -> f64 {
    t.primitive_width().map_or(24.0, |w| w as f64)
}

/// The mean of per-sample costs.
pub fn mean(costs: impl Iterator<Item = SampleCost>) -> SampleCost {
    let mut total = SampleCost::default();
    let mut n = 0usize;
    for c in costs {
        total += c;
        n += 1;
    }
    let n = n.max(1) as f64;
    SampleCost {
        storage_ns: total.storage_ns / n,
        link_bytes: total.link_bytes / n,
        compute_ns: total.compute_ns / n,
        out_bytes: total.out_bytes / n,
    }
}

/// Per-row costs of every cut: `table[cut][row]`.
pub fn cost_table(
    pipeline: &Pipeline,
    profiles: &Profiles,
    rows: &[SampleStats],
) -> Vec<Vec<SampleCost>> {
    let model = CostModel::new(pipeline, profiles);
    (0..=pipeline.depth())
        .map(|k| {
            let cut = pipeline.cut(k);
            rows.iter().map(|r| model.sample(&cut, r)).collect()
        })
        .collect()
}
