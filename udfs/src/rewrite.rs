//! The analyzer rule that makes sluice UDF calls self-contained and fast.
//!
//! For every call of a sluice UDF in a logical plan, [`SluiceRewrite`]:
//!
//! 1. **completes its arguments**: optional parameters get their defaults,
//!    random UDFs get the session's seed and epoch as literals, and UDFs that
//!    report bad samples get the row's `key` column (see [`crate::args`]).
//!    The plan then carries everything a UDF needs, so a fragment shipped to
//!    another process computes the same bytes;
//! 2. **fuses** `resize(decode_image(data), …)` into `decode_resize(data, …)`
//!    and `random_resized_crop(decode_image(data), …)` into
//!    `decode_random_resized_crop(data, …)`, which decode JPEGs at a reduced
//!    DCT scale when the output allows;
//! 3. under the `skip` policy, **filters out** the rows whose UDF results are
//!    NULL because their sample was bad, right above the projection that
//!    computed them.
//!
//! Output column names are preserved: users see `resize(decode_image(data),
//! Int64(224), Int64(224))`, not the completed call.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, ScalarUDF};
use datafusion::optimizer::AnalyzerRule;

use crate::env::{OnError, UdfEnv};
use crate::udf::{DecodeImage, DecodeRandomResizedCrop, DecodeResize, Function, Udf, spec};

/// The sample key column the hidden `key` argument reads.
pub const KEY_COLUMN: &str = "key";

/// See the module docs.
#[derive(Debug)]
pub struct SluiceRewrite {
    env: Arc<UdfEnv>,
    decode_resize: Arc<ScalarUDF>,
    decode_rrc: Arc<ScalarUDF>,
}

impl SluiceRewrite {
    /// A rule for the UDFs bound to `env`.
    pub fn new(env: Arc<UdfEnv>) -> Self {
        Self {
            decode_resize: Arc::new(Udf::<DecodeResize>::udf(&env)),
            decode_rrc: Arc::new(Udf::<DecodeRandomResizedCrop>::udf(&env)),
            env,
        }
    }

    fn rewrite_node(&self, node: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
        let key = key_column(&node);
        let names = NamePreserver::new(&node);
        let mut keyed_calls = false;
        let t = node.map_expressions(|expr| {
            let saved = names.save(&expr);
            let t = expr.transform_up(|e| self.rewrite_expr(e, key.as_ref(), &mut keyed_calls))?;
            Ok(t.update_data(|e| saved.restore(e)))
        })?;
        if !t.transformed {
            return Ok(t);
        }
        let node = t.data.recompute_schema()?;
        if let LogicalPlan::Projection(p) = &node
            && self.env.options.on_error == OnError::Skip
            && keyed_calls
        {
            let checks: Vec<Expr> = p
                .expr
                .iter()
                .zip(p.schema.iter())
                .filter(|(e, _)| contains_keyed_call(e))
                .map(|(_, (q, f))| Expr::Column(Column::new(q.cloned(), f.name())).is_not_null())
                .collect();
            if let Some(pred) = checks.into_iter().reduce(Expr::and) {
                let filter = Filter::try_new(pred, Arc::new(node))?;
                return Ok(Transformed::yes(LogicalPlan::Filter(filter)));
            }
        }
        Ok(Transformed::yes(node))
    }

    fn rewrite_expr(
        &self,
        e: Expr,
        key: Option<&Expr>,
        keyed: &mut bool,
    ) -> Result<Transformed<Expr>> {
        let Expr::ScalarFunction(call) = e else {
            return Ok(Transformed::no(e));
        };
        let Some(spec) = spec(call.func.name()) else {
            return Ok(Transformed::no(Expr::ScalarFunction(call)));
        };
        if spec.is_complete(call.args.len()) {
            return Ok(Transformed::no(Expr::ScalarFunction(call)));
        }
        if spec.random && key.is_none() {
            return Err(DataFusionError::Plan(format!(
                "{} draws its randomness from the sample key: call it where the dataset's \
                 `{KEY_COLUMN}` column is in scope (a SELECT directly over the dataset)",
                spec.name
            )));
        }
        *keyed |= spec.keyed;
        let key = key
            .cloned()
            .unwrap_or(Expr::Literal(ScalarValue::Utf8(None), None));
        let (seed, epoch) = (self.env.options.seed, self.env.options.epoch);
        let args = spec.complete(call.args, seed, epoch, key);
        Ok(Transformed::yes(self.fuse(call.func, args)))
    }

    /// `resize`/`random_resized_crop` of a completed `decode_image(data, mode, key)`.
    fn fuse(&self, func: Arc<ScalarUDF>, args: Vec<Expr>) -> Expr {
        let decoded = match args.first() {
            Some(Expr::ScalarFunction(inner))
                if inner.func.name() == DecodeImage::SPEC.name
                    && DecodeImage::SPEC.is_complete(inner.args.len()) =>
            {
                Some(inner.args.clone())
            }
            _ => None,
        };
        let Some([data, mode, key]) = decoded.and_then(|a| <[Expr; 3]>::try_from(a).ok()) else {
            return Expr::ScalarFunction(ScalarFunction::new_udf(func, args));
        };
        match func.name() {
            // resize(img, h, w, filter) → decode_resize(data, h, w, filter, mode, key)
            "resize" => {
                let [_, h, w, filter] = take4(args);
                Expr::ScalarFunction(ScalarFunction::new_udf(
                    Arc::clone(&self.decode_resize),
                    vec![data, h, w, filter, mode, key],
                ))
            }
            // random_resized_crop(img, h, w, s0, s1, r0, r1, seed, epoch, key)
            // → decode_random_resized_crop(data, h, w, s0, s1, r0, r1, mode, seed, epoch, key)
            "random_resized_crop" => {
                let mut rest = args.into_iter().skip(1);
                let mut fused: Vec<Expr> = vec![data];
                fused.extend(rest.by_ref().take(6));
                fused.push(mode);
                fused.extend(rest);
                Expr::ScalarFunction(ScalarFunction::new_udf(Arc::clone(&self.decode_rrc), fused))
            }
            _ => Expr::ScalarFunction(ScalarFunction::new_udf(func, args)),
        }
    }
}

fn take4(args: Vec<Expr>) -> [Expr; 4] {
    let mut it = args.into_iter();
    let mut next = || it.next().unwrap_or(Expr::Literal(ScalarValue::Null, None));
    [next(), next(), next(), next()]
}

/// The `key` column of `node`'s single input, when it has one.
fn key_column(node: &LogicalPlan) -> Option<Expr> {
    let [input] = node.inputs()[..] else {
        return None;
    };
    let schema = input.schema();
    let mut found = schema
        .iter()
        .filter(|(_, f)| f.name() == KEY_COLUMN)
        .map(|(q, f)| Expr::Column(Column::new(q.cloned(), f.name())));
    let first = found.next()?;
    // Two `key` columns (a join): ambiguous, so none.
    found.next().is_none().then_some(first)
}

fn contains_keyed_call(e: &Expr) -> bool {
    e.exists(|e| {
        Ok(matches!(e, Expr::ScalarFunction(f) if spec(f.func.name()).is_some_and(|s| s.keyed)))
    })
    .unwrap_or(false)
}

impl AnalyzerRule for SluiceRewrite {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        Ok(plan
            .transform_up_with_subqueries(|node| self.rewrite_node(node))?
            .data)
    }

    fn name(&self) -> &str {
        "sluice_rewrite"
    }
}
