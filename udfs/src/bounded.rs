//! DataFusion's built-in functions whose output is not bounded by their
//! input, under a size limit.
//!
//! `repeat('x', 2000000000)`, `lpad(s, 2000000000)`, `array_repeat(x, n)`,
//! `range(0, 10000000000)`, `encode(data, 'hex')` of a large sample, or
//! `replace(repeat('x', 1e9), 'x', 'xxxxxxxx')`
//! (each step under the limit) allocate what one short literal asks for,
//! outside any memory pool: one query could grow the server until the
//! allocator aborts. Each is wrapped here so that a batch whose results
//! would exceed the session's `max_decoded_bytes` fails with an error
//! naming the function and the limit *before* the inner function
//! allocates; everything else is the inner function's. The bound is
//! computed from the arguments' sizes; where that is only a worst case
//! (`replace`, `regexp_replace`: every byte a match) and it is past the
//! limit, the real matches are counted before anything is refused. The
//! `||` operator is bounded the same way by [`crate::concat_operator`].
//! Within that limit, a call also reserves its output in the process's
//! memory budget while it runs ([`crate::memory_budget`]): one that does
//! not fit what is left is refused the same way.

use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::FunctionRegistry;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature,
};

use crate::arg_sizes::{Strs, byte_lens, ints, sum_rows, texts};
use crate::concat_operator::{ConcatOperator, ConcatRewrite};
use crate::env::UdfEnv;

/// How a wrapped function's output size follows from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Growth {
    /// `repeat(text, n)`, `array_repeat(element, n)`: argument 0's bytes
    /// (a string's length, an element's size) times n.
    Repeat,
    /// `lpad/rpad(text, n, …)`: n characters of up to 4 bytes.
    Pad,
    /// `range/generate_series(start, stop[, step])`: one 8-byte value
    /// per step.
    Range,
    /// `replace(text, from, to)`: every occurrence of `from` (between
    /// every two characters when it is empty) becomes `to`.
    Replace,
    /// `regexp_replace(text, pattern, replacement[, flags])`: a match may
    /// be empty (one at every position), and each `$n` or `\n` in the
    /// replacement brings back up to the whole text once over all matches.
    RegexpReplace,
    /// `concat(a, b, …)`, `overlay(…)`: the sum of the arguments.
    Sum,
    /// `concat_ws(sep, a, b, …)`: the arguments and a separator between
    /// each two.
    ConcatWs,
    /// `encode(bytes, 'hex' | 'base64' …)`: two characters a byte in hex,
    /// four per three in base64.
    Encode,
}

/// The functions wrapped, and how each grows.
const BOUNDED: &[(&str, Growth)] = &[
    ("repeat", Growth::Repeat),
    ("lpad", Growth::Pad),
    ("rpad", Growth::Pad),
    ("array_repeat", Growth::Repeat),
    ("range", Growth::Range),
    ("generate_series", Growth::Range),
    ("replace", Growth::Replace),
    ("regexp_replace", Growth::RegexpReplace),
    ("concat", Growth::Sum),
    ("overlay", Growth::Sum),
    ("concat_ws", Growth::ConcatWs),
    ("encode", Growth::Encode),
];

/// Replaces the functions of [`BOUNDED`] registered in `ctx` with
/// wrappers that refuse a batch whose results exceed `env`'s
/// `max_decoded_bytes`, and bounds the `||` operator the same way
/// ([`crate::concat_operator`]).
pub fn register(ctx: &SessionContext, env: &Arc<UdfEnv>) {
    let limit = env.options.limits.max_decoded_bytes;
    let operator = Arc::new(ScalarUDF::new_from_impl(ConcatOperator::new(limit)));
    ctx.register_udf((*operator).clone());
    // Registering a rewrite cannot fail on a session's state.
    let _ = ctx
        .state_ref()
        .write()
        .register_function_rewrite(Arc::new(ConcatRewrite::new(operator)));
    for &(name, growth) in BOUNDED {
        let Ok(inner) = ctx.udf(name) else {
            continue;
        };
        ctx.register_udf(ScalarUDF::new_from_impl(Bounded {
            inner: (*inner).clone(),
            growth,
            limit: env.options.limits.max_decoded_bytes,
        }));
    }
}

/// A function under a limit on its batch's output bytes.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Bounded {
    inner: ScalarUDF,
    growth: Growth,
    limit: u64,
}

impl Bounded {
    /// The batch's output bytes, saturating.
    fn output_bytes(&self, args: &[ColumnarValue], rows: usize) -> Result<u64> {
        let rows = rows.max(1);
        let times = |n: i64| u64::try_from(n).unwrap_or(0);
        let total = match self.growth {
            Growth::Repeat => {
                let (lens, counts) = (byte_lens(args, 0, rows)?, ints(args, 1, rows)?);
                lens.iter().zip(counts).fold(0u64, |t, (&l, n)| {
                    t.saturating_add(l.saturating_mul(times(n)))
                })
            }
            Growth::Pad => ints(args, 1, rows)?
                .into_iter()
                .fold(0u64, |t, n| t.saturating_add(times(n).saturating_mul(4))),
            Growth::Replace => {
                let (text, from, to) = (
                    byte_lens(args, 0, rows)?,
                    byte_lens(args, 1, rows)?,
                    byte_lens(args, 2, rows)?,
                );
                (0..rows).fold(0u64, |t, r| {
                    let grown = match from[r] {
                        0 => text[r].saturating_add(1).saturating_mul(to[r]),
                        f => (text[r] / f).saturating_mul(to[r].saturating_sub(f)),
                    };
                    t.saturating_add(text[r].saturating_add(grown))
                })
            }
            Growth::RegexpReplace => {
                let (text, replacement) = (byte_lens(args, 0, rows)?, texts(args, 2, rows)?);
                (0..rows).fold(0u64, |t, r| {
                    let refs = replacement[r].matches(['$', '\\']).count() as u64;
                    let each = replacement[r].len() as u64;
                    let grown = text[r]
                        .saturating_add(1)
                        .saturating_mul(each)
                        .saturating_add(text[r].saturating_mul(refs));
                    t.saturating_add(text[r].saturating_add(grown))
                })
            }
            Growth::Sum | Growth::ConcatWs => {
                let mut per_row = vec![0u64; rows];
                for i in 0..args.len() {
                    // concat_ws: the separator comes once between each two.
                    let times = match (self.growth, i) {
                        (Growth::ConcatWs, 0) => args.len().saturating_sub(2) as u64,
                        _ => 1,
                    };
                    for (t, l) in per_row.iter_mut().zip(byte_lens(args, i, rows)?) {
                        *t = t.saturating_add(l.saturating_mul(times));
                    }
                }
                per_row.into_iter().fold(0u64, u64::saturating_add)
            }
            Growth::Encode => {
                let (data, encoding) = (byte_lens(args, 0, rows)?, texts(args, 1, rows)?);
                (0..rows).fold(0u64, |t, r| {
                    let n = data[r];
                    let out = match encoding[r].to_ascii_lowercase().as_str() {
                        "base64" | "base64pad" => n.div_ceil(3).saturating_mul(4),
                        _ => n.saturating_mul(2),
                    };
                    t.saturating_add(out)
                })
            }
            Growth::Range => {
                if !args.iter().all(|a| a.data_type().is_integer()) {
                    // Date and timestamp ranges step by intervals: their
                    // length is not a subtraction; the inner function
                    // checks them.
                    return Ok(0);
                }
                let (start, stop, step) = match args.len() {
                    1 => (vec![0; rows], ints(args, 0, rows)?, vec![1; rows]),
                    2 => (ints(args, 0, rows)?, ints(args, 1, rows)?, vec![1; rows]),
                    _ => (
                        ints(args, 0, rows)?,
                        ints(args, 1, rows)?,
                        ints(args, 2, rows)?,
                    ),
                };
                (0..rows).fold(0u64, |t, r| {
                    let span = i128::from(stop[r]) - i128::from(start[r]);
                    let step = i128::from(step[r]);
                    let n = if step == 0 || (span > 0) != (step > 0) {
                        0
                    } else {
                        (span / step).unsigned_abs() + 1
                    };
                    t.saturating_add(u64::try_from(n).unwrap_or(u64::MAX).saturating_mul(8))
                })
            }
        };
        Ok(total)
    }
}

/// `replace(text, from, to)`'s output bytes, from the real matches.
fn exact_replace(args: &[ColumnarValue], rows: usize) -> Result<u64> {
    let (text, from, to) = (
        Strs::new(args, 0)?,
        Strs::new(args, 1)?,
        Strs::new(args, 2)?,
    );
    let row_bytes = |r: usize| -> u64 {
        let (Some(text), Some(from), Some(to)) = (text.get(r), from.get(r), to.get(r)) else {
            return 0;
        };
        let matches = if from.is_empty() {
            text.chars().count() as u64 + 1
        } else if to.len() <= from.len() {
            return text.len() as u64;
        } else {
            text.matches(from).count() as u64
        };
        let grown = matches.saturating_mul((to.len() - from.len()) as u64);
        (text.len() as u64).saturating_add(grown)
    };
    Ok(sum_rows(args, rows, row_bytes))
}

/// `regexp_replace(text, pattern, replacement[, flags])`'s output bytes
/// from the real matches: each becomes the replacement with every group
/// reference brought back at most the whole match. A pattern the regex
/// engine refuses counts as no match (the function reports it).
fn exact_regexp_replace(args: &[ColumnarValue], rows: usize) -> Result<u64> {
    let (text, pattern, replacement, flags) = (
        Strs::new(args, 0)?,
        Strs::new(args, 1)?,
        Strs::new(args, 2)?,
        Strs::new(args, 3)?,
    );
    let mut compiled: Option<((String, String), Option<regex::Regex>)> = None;
    let row_bytes = |r: usize| -> u64 {
        let (Some(text), Some(pattern), Some(repl)) =
            (text.get(r), pattern.get(r), replacement.get(r))
        else {
            return 0;
        };
        let flags = flags.get(r).unwrap_or("");
        let key = (pattern.to_owned(), flags.to_owned());
        if compiled.as_ref().is_none_or(|(k, _)| *k != key) {
            let inline: String = flags.chars().filter(|&c| c != 'g').collect();
            let full = if inline.is_empty() {
                pattern.to_owned()
            } else {
                format!("(?{inline}){pattern}")
            };
            compiled = Some((key, regex::Regex::new(&full).ok()));
        }
        let Some((_, Some(re))) = &compiled else {
            return text.len() as u64;
        };
        let refs = repl.matches(['$', '\\']).count() as u64;
        let limit = if flags.contains('g') { usize::MAX } else { 1 };
        re.find_iter(text)
            .take(limit)
            .fold(text.len() as u64, |t, m| {
                let m = m.len() as u64;
                t.saturating_add(repl.len() as u64)
                    .saturating_add(refs.saturating_mul(m))
                    .saturating_sub(m)
            })
    };
    Ok(sum_rows(args, rows, row_bytes))
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs<'_>) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        // A simplification that evaluates the call (constant folding)
        // goes through `invoke_with_args` below, so it is checked too.
        self.inner.simplify(args, info)
    }

    fn short_circuits(&self) -> bool {
        self.inner.short_circuits()
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let mut bytes = self.output_bytes(&args.args, args.number_rows)?;
        if bytes > self.limit {
            // The bound above is the worst case (every byte a match);
            // counting the real matches costs a scan, paid only here.
            bytes = match self.growth {
                Growth::Replace => exact_replace(&args.args, args.number_rows)?,
                Growth::RegexpReplace => exact_regexp_replace(&args.args, args.number_rows)?,
                _ => bytes,
            };
        }
        if bytes > self.limit {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{}: its results would take {bytes} bytes, over the limit of {} \
                 (max_decoded_bytes)",
                self.inner.name(),
                self.limit
            )));
        }
        // Held while the inner function allocates (see
        // `crate::memory_budget`).
        let _held = crate::memory_budget::MemoryBudget::global().reserve(
            self.inner.name(),
            bytes.saturating_mul(crate::memory_budget::COPIES),
        )?;
        self.inner.invoke_with_args(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    /// The result of `sql`, as a printed table.
    async fn table(ctx: &SessionContext, sql: &str) -> String {
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string()
    }

    async fn run(ctx: &SessionContext, sql: &str) -> Result<usize> {
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }

    #[tokio::test]
    async fn growth_past_the_limit_is_refused_by_name_before_it_allocates() {
        let ctx = SessionContext::new();
        crate::register(&ctx, &UdfEnv::new(Default::default()));
        for (sql, name) in [
            ("SELECT length(repeat('x', 2000000000))", "repeat"),
            ("SELECT lpad('a', 2000000000)", "lpad"),
            ("SELECT rpad('a', 2000000000, 'b')", "rpad"),
            ("SELECT cardinality(range(0, 10000000000))", "range"),
            (
                "SELECT cardinality(generate_series(1, 10000000000, 1))",
                "generate_series",
            ),
            (
                "SELECT cardinality(array_repeat(1, 1000000000))",
                "array_repeat",
            ),
            // Not literals: the counts come from a column at run time.
            (
                "SELECT length(repeat(s, n)) FROM (VALUES ('ab', 1), ('cd', 600000000)) t(s, n)",
                "repeat",
            ),
        ] {
            let e = run(&ctx, sql).await.unwrap_err().to_string();
            assert!(
                e.contains(&format!("{name}: its results would take"))
                    && e.contains("max_decoded_bytes"),
                "{sql}: {e}"
            );
        }
        // Each step within the limit, the growth past it (replace over
        // repeat grew the server to 14 GB); a 1 MiB limit keeps this fast.
        let mut options = crate::UdfOptions::default();
        options.limits.max_decoded_bytes = 1 << 20;
        let small = SessionContext::new();
        crate::register(&small, &UdfEnv::new(options));
        for (sql, name) in [
            (
                "SELECT length(replace(repeat('x', 200000), 'x', 'xxxxxxxx'))",
                "replace",
            ),
            (
                "SELECT length(replace(repeat('ab', 100000), '', '-----'))",
                "replace",
            ),
            (
                "SELECT length(regexp_replace(repeat('x', 300000), 'x', '$0$0$0$0', 'g'))",
                "regexp_replace",
            ),
            (
                "WITH a AS (SELECT repeat('x', 300000) AS s) \
                 SELECT length(concat(s, s, s, s)) FROM a",
                "concat",
            ),
            (
                "WITH a AS (SELECT repeat('x', 300000) AS s) \
                 SELECT length(concat_ws(s, 'a', 'b', 'c', 'd', 'e')) FROM a",
                "concat_ws",
            ),
            (
                "SELECT length(encode(repeat('x', 600000), 'hex'))",
                "encode",
            ),
        ] {
            let e = run(&small, sql).await.map(|_| "no error".to_owned());
            let e = e.unwrap_or_else(|e| e.to_string());
            assert!(
                e.contains(&format!("{name}: its results would take")),
                "{sql}: {e}"
            );
        }
        // The worst case (every byte a match) is past the limit, the real
        // result within it: counted, not refused.
        for sql in [
            "SELECT length(replace(repeat('x.', 300000), 'x', 'xx'))",
            "SELECT length(replace(s, 'x', 'xx')) FROM (VALUES (repeat('x.', 300000))) t(s)",
            "SELECT length(regexp_replace(repeat('ab', 200000), 'a', '$0', 'g'))",
            "SELECT length(regexp_replace(repeat('x', 400000), 'x+', '<$0>'))",
            "SELECT length(encode(repeat('x', 600000), 'base64'))",
        ] {
            assert!(run(&small, sql).await.is_ok(), "{sql}");
        }
        for (sql, name) in [
            (
                "SELECT length(replace(repeat('x.', 400000), 'x', 'xxxx'))",
                "replace",
            ),
            (
                "SELECT length(regexp_replace(repeat('xa', 300000), 'x', '$0$0$0', 'g'))",
                "regexp_replace",
            ),
        ] {
            let e = run(&small, sql).await.map(|_| "no error".to_owned());
            let e = e.unwrap_or_else(|e| e.to_string());
            assert!(
                e.contains(&format!("{name}: its results would take")),
                "{sql}: {e}"
            );
        }
        // Within the limit, the functions are DataFusion's own.
        let text = table(
            &ctx,
            "SELECT repeat('ab', 3) AS r, lpad('ab', 5, '*') AS l, \
             cardinality(range(1, 10, 2)) AS n, cardinality(array_repeat(7, 4)) AS a, \
             cardinality(range(10, 1, -3)) AS d",
        )
        .await;
        assert!(text.contains("ababab") && text.contains("***ab"), "{text}");
        assert!(text.contains("| 5 | 4 | 3 |"), "{text}");
        let text = table(
            &ctx,
            "SELECT replace('banana', 'an', 'AN') AS r, \
             regexp_replace('banana', '(a)', '<$1>', 'g') AS g, \
             concat('a', NULL, 'b') AS c, concat_ws('-', 'a', 'b', 'c') AS w, \
             replace('ab', '', '.') AS e",
        )
        .await;
        for want in ["bANANa", "b<a>n<a>n<a>", "| ab ", "a-b-c"] {
            assert!(text.contains(want), "{want}: {text}");
        }
        assert_eq!(
            run(&ctx, "SELECT count(*) FROM generate_series(1, 1000)")
                .await
                .unwrap(),
            1
        );
    }
}
