//! A panic in any function of a projection, as one named sample.
//!
//! sluice's own UDFs catch a decoder's panic per row. DataFusion's
//! built-in functions do not: `encode(data, 'hex')` over a sample whose
//! result outgrows an Arrow array panics in arrow's offset builder, and
//! without a guard the batch (and the query) ended with a message naming
//! neither the function nor the sample. [`guard_plan`] wraps each
//! expression of every [`ProjectionExec`] of a plan in a [`GuardedExpr`]:
//!
//! - a batch that evaluates is untouched (one `catch_unwind`, no copy);
//! - a batch that panics is evaluated again row by row, to find the rows
//!   at fault; for each, the innermost call that panics on it is named,
//!   with the row's `key` (when the projection's input has one) and the
//!   panic's message;
//! - the session's error policy then applies: under `fail` the query
//!   fails with that error; under `skip` and `null` the value is NULL and
//!   the sample is logged as a bad sample (a job lists it), like a UDF's
//!   bad sample. A built-in function cannot drop its row, so under `skip`
//!   the row stays with NULL; a column declared non-nullable fails instead.
//!
//! Compute plans are guarded once placed (`compute-exec`), storage
//! fragments once bound on the node that runs them (`storage-exec`), so
//! the guard never travels on the wire and EXPLAIN prints the expression
//! as it is (the guard displays as its inner expression).

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, new_null_array};
use arrow::datatypes::{DataType, FieldRef, Schema};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

use sluice_base::BadSample;

use crate::env::{OnError, UdfEnv};
use crate::rewrite::KEY_COLUMN;
use crate::udf::panic_message;

/// Wraps the expressions of every projection of `plan` in a
/// [`GuardedExpr`] under `env`'s policy (once: a guarded plan is left as
/// it is).
pub fn guard_plan(
    plan: Arc<dyn ExecutionPlan>,
    env: &Arc<UdfEnv>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(p) = node.downcast_ref::<ProjectionExec>() else {
            return Ok(Transformed::no(node));
        };
        if p.expr()
            .iter()
            .all(|e| e.expr.downcast_ref::<GuardedExpr>().is_some())
        {
            return Ok(Transformed::no(node));
        }
        let exprs = p
            .expr()
            .iter()
            .map(|e| {
                let guarded: Arc<dyn PhysicalExpr> = match e.expr.downcast_ref::<GuardedExpr>() {
                    Some(_) => Arc::clone(&e.expr),
                    None => Arc::new(GuardedExpr::new(Arc::clone(&e.expr), Arc::clone(env))),
                };
                ProjectionExpr::new(guarded, e.alias.clone())
            })
            .collect::<Vec<_>>();
        let rebuilt: Arc<dyn ExecutionPlan> =
            Arc::new(ProjectionExec::try_new(exprs, Arc::clone(p.input()))?);
        Ok(Transformed::yes(rebuilt))
    })
    .map(|t| t.data)
}

/// An expression whose panics become named bad samples (see the module).
#[derive(Debug)]
pub struct GuardedExpr {
    inner: Arc<dyn PhysicalExpr>,
    env: Arc<UdfEnv>,
}

impl GuardedExpr {
    /// `inner` under `env`'s error policy.
    pub fn new(inner: Arc<dyn PhysicalExpr>, env: Arc<UdfEnv>) -> Self {
        Self { inner, env }
    }

    /// The same guard, reporting under `env` instead.
    pub fn under(&self, env: &Arc<UdfEnv>) -> Self {
        Self::new(Arc::clone(&self.inner), Arc::clone(env))
    }

    /// The batch evaluated row by row after it panicked whole.
    fn recover(&self, batch: &RecordBatch, panic: Box<dyn Any + Send>) -> Result<ColumnarValue> {
        let field = self.inner.return_field(&batch.schema())?;
        let mut parts: Vec<ArrayRef> = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let one = batch.slice(row, 1);
            match evaluate_caught(&self.inner, &one) {
                Ok(v) => parts.push(v?.into_array(1)?),
                Err(p) => {
                    let bad = BadSample {
                        udf: culprit(&self.inner, &one),
                        key: key_of(batch, row),
                        reason: format!("panicked: {}", clip(&panic_message(&p))),
                    };
                    let fail = self.env.options.on_error == OnError::Fail || !field.is_nullable();
                    if fail {
                        return Err(bad.into_error());
                    }
                    self.env.errors.record(bad);
                    parts.push(new_null_array(field.data_type(), 1));
                }
            }
        }
        if parts.is_empty() {
            return Err(DataFusionError::Execution(format!(
                "{}: panicked on an empty batch: {}",
                self.inner,
                clip(&panic_message(&panic))
            )));
        }
        let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
        let joined = arrow::compute::concat(&refs).map_err(|e| {
            DataFusionError::Execution(format!(
                "{}: every row evaluates alone, but the batch's results do not fit in one \
                 array ({e}); lower the batch size",
                clip(&self.inner.to_string())
            ))
        })?;
        Ok(ColumnarValue::Array(joined))
    }
}

/// `expr` on `batch`, a panic caught.
fn evaluate_caught(
    expr: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
) -> std::result::Result<Result<ColumnarValue>, Box<dyn Any + Send>> {
    std::panic::catch_unwind(AssertUnwindSafe(|| expr.evaluate(batch)))
}

/// The innermost call of `expr` that panics on `row` (a one-row batch):
/// a function by its name, another expression as it prints.
fn culprit(expr: &Arc<dyn PhysicalExpr>, row: &RecordBatch) -> String {
    for child in expr.children() {
        if evaluate_caught(child, row).is_err() {
            return culprit(child, row);
        }
    }
    match expr.downcast_ref::<ScalarFunctionExpr>() {
        Some(f) => f.name().to_owned(),
        None => clip(&expr.to_string()),
    }
}

/// The sample key of `row` of `batch`, or `row N` when it has none.
fn key_of(batch: &RecordBatch, row: usize) -> String {
    let keys = batch.column_by_name(KEY_COLUMN).filter(|k| {
        matches!(
            k.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        ) && !k.is_null(row)
    });
    match keys {
        Some(k) => match k.data_type() {
            DataType::Utf8 => k.as_string::<i32>().value(row).to_owned(),
            DataType::LargeUtf8 => k.as_string::<i64>().value(row).to_owned(),
            _ => k.as_string_view().value(row).to_owned(),
        },
        None => format!("row {row}"),
    }
}

/// At most 200 characters of `s`.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(200).collect();
    if s.chars().nth(200).is_some() {
        out.push('…');
    }
    out
}

/// The one child of a wrapper expression (`what`: the wrapper, for the
/// error) being given new children.
pub(crate) fn only_child(
    children: Vec<Arc<dyn PhysicalExpr>>,
    what: &str,
) -> Result<Arc<dyn PhysicalExpr>> {
    let [inner] = <[_; 1]>::try_from(children)
        .map_err(|c| DataFusionError::Internal(format!("{what} has one child, not {}", c.len())))?;
    Ok(inner)
}

impl fmt::Display for GuardedExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl PartialEq for GuardedExpr {
    fn eq(&self, other: &Self) -> bool {
        self.inner.as_ref() == other.inner.as_ref()
    }
}

impl Eq for GuardedExpr {}

impl Hash for GuardedExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.as_ref().hash(state);
    }
}

impl PhysicalExpr for GuardedExpr {
    fn return_field(&self, input_schema: &Schema) -> Result<FieldRef> {
        self.inner.return_field(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        match evaluate_caught(&self.inner, batch) {
            Ok(result) => result,
            Err(panic) => self.recover(batch, panic),
        }
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.inner]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let inner = only_child(children, "a guard")?;
        Ok(Arc::new(Self::new(inner, Arc::clone(&self.env))))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt_sql(f)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, AsArray, StringArray};
    use arrow::datatypes::DataType;
    use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;

    use super::guard_plan;
    use crate::env::{OnError, UdfEnv, UdfOptions};

    /// A session with `boom(s)`: `s` in upper case, but a panic (as a
    /// third-party function's) on the value 'b'.
    fn ctx() -> SessionContext {
        let ctx = SessionContext::new();
        ctx.register_udf(create_udf(
            "boom",
            vec![DataType::Utf8],
            DataType::Utf8,
            Volatility::Immutable,
            Arc::new(|args: &[ColumnarValue]| {
                let a = args[0].to_array(1)?;
                let s = a.as_string::<i32>();
                let out: StringArray = s
                    .iter()
                    .map(|v| {
                        assert!(v != Some("b"), "offsets must be monotonically increasing");
                        v.map(str::to_uppercase)
                    })
                    .collect();
                Ok(ColumnarValue::Array(Arc::new(out)))
            }),
        ));
        let keys: Arc<dyn Array> = Arc::new(StringArray::from(vec!["a", "b", "c"]));
        let batch = arrow::array::RecordBatch::try_from_iter([("key", keys)]).unwrap();
        ctx.register_batch("t", batch).unwrap();
        ctx
    }

    const SQL: &str = "SELECT key, upper(boom(key)) AS v FROM t";

    /// [`SQL`]'s physical plan in `ctx`.
    async fn physical(ctx: &SessionContext) -> Arc<dyn datafusion::physical_plan::ExecutionPlan> {
        let df = ctx.sql(SQL).await.unwrap();
        df.create_physical_plan().await.unwrap()
    }

    async fn run(on_error: OnError) -> (datafusion::error::Result<Vec<String>>, Arc<UdfEnv>) {
        let env = UdfEnv::new(UdfOptions {
            on_error,
            ..UdfOptions::default()
        });
        let ctx = ctx();
        let plan = guard_plan(physical(&ctx).await, &env).unwrap();
        let text = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(false)
            .to_string();
        assert!(
            text.contains("upper(boom(key@0)) as v"),
            "shown as it is: {text}"
        );
        let out = collect(plan, ctx.task_ctx()).await.map(|batches| {
            batches
                .iter()
                .flat_map(|b| {
                    let v = b.column(1).as_string::<i32>().clone();
                    (0..v.len()).map(move |i| v.is_valid(i).then(|| v.value(i).to_owned()))
                })
                .map(|v| v.unwrap_or_else(|| "NULL".into()))
                .collect()
        });
        (out, env)
    }

    #[tokio::test]
    async fn a_panic_fails_naming_the_function_and_the_sample() {
        let (out, env) = run(OnError::Fail).await;
        let e = out.unwrap_err().to_string();
        assert!(
            e.contains("boom: sample 'b': panicked: offsets must be monotonically increasing"),
            "{e}"
        );
        assert_eq!(env.errors.snapshot().0, 0);
    }

    #[tokio::test]
    async fn under_null_and_skip_the_sample_is_null_and_logged() {
        for policy in [OnError::Null, OnError::Skip] {
            let (out, env) = run(policy).await;
            assert_eq!(out.unwrap(), ["A", "NULL", "C"], "{policy}");
            let (n, bad) = env.errors.snapshot();
            assert_eq!(n, 1);
            assert_eq!((bad[0].udf.as_str(), bad[0].key.as_str()), ("boom", "b"));
        }
    }

    #[tokio::test]
    async fn a_guarded_plan_is_guarded_once() {
        let env = UdfEnv::new(UdfOptions::default());
        let once = guard_plan(physical(&ctx()).await, &env).unwrap();
        let twice = guard_plan(Arc::clone(&once), &env).unwrap();
        assert!(Arc::ptr_eq(&once, &twice));
    }
}
