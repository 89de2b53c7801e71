//! The `||` operator on strings and bytes, under the size limit.
//!
//! `a || b` is a binary operator in DataFusion, not a function, so the
//! wrappers of [`crate::bounded`] cannot reach it: a chain of `||` over
//! values near `max_decoded_bytes` (`s || s || s || s` with `s` a 500 MB
//! `repeat`) allocates several times the limit outside any memory pool.
//! [`ConcatRewrite`], a function rewrite (it runs in the analyzer, before
//! type coercion, on every plan: SQL, YAML or JSON), turns each `||` whose
//! sides are not lists into [`ConcatOperator`], which
//!
//! - coerces its arguments exactly as the operator does (so the result
//!   type, `Utf8`, `Utf8View`, `LargeUtf8` or a binary type, is the
//!   operator's),
//! - refuses a batch whose results would pass the limit before it
//!   allocates, naming `||` and the limit,
//! - and computes with the operator's own kernel (`concat_elements_dyn`),
//!   so a NULL side gives NULL, unlike `concat`.
//!
//! Column names are kept: `SELECT key || '.jpg'` is still named
//! `key || Utf8(".jpg")`. List `||` (array concatenation) is DataFusion's.

use std::sync::Arc;

use arrow::array::Array;
use arrow::compute::kernels::concat_elements::concat_elements_dyn;
use arrow::datatypes::DataType;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::FunctionRewrite;
use datafusion::logical_expr::type_coercion::binary::BinaryTypeCoercer;
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, ExprSchemable, Operator, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};

use crate::arg_sizes::byte_lens;

/// The function `||` on strings becomes.
pub const NAME: &str = "concat_operator";

/// `a || b` (null in, null out) under a limit on a batch's output bytes.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ConcatOperator {
    signature: Signature,
    limit: u64,
}

impl ConcatOperator {
    /// The operator refusing batches over `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
            limit,
        }
    }
}

/// The operator's coercion of `(left, right)`: (input types, result type).
fn coerce(arg_types: &[DataType]) -> Result<((DataType, DataType), DataType)> {
    let [l, r] = arg_types else {
        return Err(DataFusionError::Plan(format!(
            "{NAME} takes 2 arguments, got {}",
            arg_types.len()
        )));
    };
    let c = BinaryTypeCoercer::new(l, &Operator::StringConcat, r);
    Ok((c.get_input_types()?, c.get_result_type()?))
}

impl ScalarUDFImpl for ConcatOperator {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let ((l, r), _) = coerce(arg_types)?;
        Ok(vec![l, r])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(coerce(arg_types)?.1)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows.max(1);
        let [left, right] = args.args.as_slice() else {
            return Err(DataFusionError::Internal(format!(
                "{NAME}: not 2 arguments"
            )));
        };
        // Measured before anything is built: a scalar counts once a row.
        let bytes = byte_lens(&args.args, 0, rows)?
            .into_iter()
            .zip(byte_lens(&args.args, 1, rows)?)
            .fold(0u64, |t, (a, b)| t.saturating_add(a.saturating_add(b)));
        if bytes > self.limit {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "||: its results would take {bytes} bytes, over the limit of {} \
                 (max_decoded_bytes)",
                self.limit
            )));
        }
        // Held while the result is built (see `crate::memory_budget`).
        let _held = crate::memory_budget::MemoryBudget::global()
            .reserve(NAME, bytes.saturating_mul(crate::memory_budget::COPIES))?;
        if let (ColumnarValue::Scalar(l), ColumnarValue::Scalar(r)) = (left, right) {
            let joined = concat_elements_dyn(&l.to_array()?, &r.to_array()?)?;
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                &joined, 0,
            )?));
        }
        let (l, r) = (left.to_array(rows)?, right.to_array(rows)?);
        let joined = concat_elements_dyn(&l, &r)?;
        debug_assert_eq!(joined.len(), rows);
        Ok(ColumnarValue::Array(joined))
    }
}

/// Rewrites `||` between non-list values into [`ConcatOperator`].
#[derive(Debug)]
pub struct ConcatRewrite {
    udf: Arc<ScalarUDF>,
}

impl ConcatRewrite {
    /// A rewrite into `udf` (a [`ConcatOperator`]).
    pub fn new(udf: Arc<ScalarUDF>) -> Self {
        Self { udf }
    }
}

/// Whether values of `t` are lists (`||` then concatenates arrays).
fn is_list(t: &DataType) -> bool {
    matches!(
        t,
        DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::ListView(_)
            | DataType::LargeListView(_)
    )
}

impl FunctionRewrite for ConcatRewrite {
    fn name(&self) -> &str {
        "sluice_bounded_concat_operator"
    }

    fn rewrite(
        &self,
        expr: Expr,
        schema: &DFSchema,
        _config: &ConfigOptions,
    ) -> Result<Transformed<Expr>> {
        let Expr::BinaryExpr(BinaryExpr {
            left,
            op: Operator::StringConcat,
            right,
        }) = expr
        else {
            return Ok(Transformed::no(expr));
        };
        // A side whose type is not known yet (a placeholder) or a list is
        // left to the operator.
        let types = (left.get_type(schema), right.get_type(schema));
        let (Ok(l), Ok(r)) = types else {
            return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr::new(
                left,
                Operator::StringConcat,
                right,
            ))));
        };
        if is_list(&l) || is_list(&r) || l.is_null() && r.is_null() {
            return Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr::new(
                left,
                Operator::StringConcat,
                right,
            ))));
        }
        Ok(Transformed::yes(Expr::ScalarFunction(
            ScalarFunction::new_udf(Arc::clone(&self.udf), vec![*left, *right]),
        )))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use crate::env::UdfEnv;

    async fn run(ctx: &SessionContext, sql: &str) -> Result<String, String> {
        let df = ctx.sql(sql).await.map_err(|e| e.to_string())?;
        let batches = df.collect().await.map_err(|e| e.to_string())?;
        let schema = batches[0].schema();
        let names: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| format!("{}:{}", f.name(), f.data_type()))
            .collect();
        Ok(format!(
            "{}\n{}",
            names.join(","),
            arrow::util::pretty::pretty_format_batches(&batches).map_err(|e| e.to_string())?
        ))
    }

    fn ctx(limit: Option<u64>) -> SessionContext {
        let ctx = SessionContext::new();
        let mut options = crate::UdfOptions::default();
        if let Some(limit) = limit {
            options.limits.max_decoded_bytes = limit;
        }
        crate::register(&ctx, &UdfEnv::new(options));
        ctx
    }

    #[tokio::test]
    async fn the_operator_keeps_its_names_types_and_nulls() {
        let (ours, theirs) = (ctx(None), SessionContext::new());
        for sql in [
            "SELECT s || '.jpg', s || NULL, NULL || s, s || s FROM (VALUES ('a'), (NULL), ('bc')) t(s)",
            "SELECT arrow_cast(s, 'Utf8View') || 'x' AS v, arrow_cast(s, 'LargeUtf8') || s AS l \
             FROM (VALUES ('a'), (NULL)) t(s)",
            "SELECT 'a' || 'b' || 'c', 'n' || 1, X'0102' || X'03'",
            "SELECT make_array(1, 2) || make_array(3), make_array(1) || 2",
            "SELECT s FROM (VALUES ('ab'), ('cd')) t(s) WHERE s || 'x' = 'abx'",
        ] {
            let want = run(&theirs, sql).await;
            assert!(want.is_ok(), "{sql}: {want:?}");
            assert_eq!(run(&ours, sql).await, want, "{sql}");
        }
        let plan = run(&ours, "EXPLAIN SELECT s || 'x' FROM (VALUES ('a')) t(s)")
            .await
            .unwrap();
        assert!(plan.contains(super::NAME), "{plan}");
    }

    #[tokio::test]
    async fn a_chain_past_the_limit_is_refused_by_name() {
        let small = ctx(Some(1 << 20));
        for sql in [
            "WITH a AS (SELECT repeat('x', 300000) AS s) SELECT length(s || s || s || s) FROM a",
            "SELECT length(s || s || s || s) FROM (SELECT repeat('x', 300000) AS s)",
            "SELECT (b || b || b || b) IS NULL FROM \
             (SELECT arrow_cast(repeat('x', 300000), 'Binary') AS b)",
        ] {
            let e = run(&small, sql).await.unwrap_err();
            assert!(
                e.contains("||: its results would take") && e.contains("max_decoded_bytes"),
                "{sql}: {e}"
            );
        }
        let ok = run(&small, "SELECT length(repeat('x', 1000) || 'y')").await;
        assert!(ok.unwrap().contains("1001"));
    }
}
