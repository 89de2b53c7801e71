//! Argument specifications: what each UDF accepts, its defaults, its hidden
//! arguments, and typed access to constant arguments.
//!
//! A UDF's *full* argument list is its parameters (optional ones filled with
//! their defaults), then `seed, epoch` when it is random, then `key` when it
//! reports bad samples by key. Users write only a prefix of the parameters;
//! [`crate::rewrite::SluiceRewrite`] completes the rest, so the plan carries
//! everything a UDF needs to give the same bytes anywhere.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, lit};

use sluice_base::BadSample;

use crate::env::{OnError, UdfEnv};
use crate::random::SampleRng;

/// What an argument must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A column value (bytes, image, array): any type the UDF checks itself.
    Value,
    /// A constant integer.
    Int,
    /// A constant number.
    Float,
    /// A constant string.
    Str,
    /// A constant number or list of numbers (per channel).
    Floats,
    /// A constant integer or string.
    IntOrStr,
}

/// A default value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lit {
    /// Integer.
    Int(i64),
    /// Number.
    Float(f64),
    /// String.
    Str(&'static str),
}

impl Lit {
    fn expr(self) -> Expr {
        match self {
            Lit::Int(v) => lit(v),
            Lit::Float(v) => lit(v),
            Lit::Str(v) => lit(v),
        }
    }

    fn scalar(self) -> ScalarValue {
        match self {
            Lit::Int(v) => ScalarValue::Int64(Some(v)),
            Lit::Float(v) => ScalarValue::Float64(Some(v)),
            Lit::Str(v) => ScalarValue::Utf8(Some(v.to_owned())),
        }
    }
}

/// One parameter.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// Name, for messages and docs.
    pub name: &'static str,
    /// What it must be.
    pub kind: Kind,
    /// Default, or `None` when required.
    pub default: Option<Lit>,
}

/// A required parameter.
pub const fn req(name: &'static str, kind: Kind) -> Param {
    Param {
        name,
        kind,
        default: None,
    }
}

/// An optional parameter.
pub const fn opt(name: &'static str, kind: Kind, default: Lit) -> Param {
    Param {
        name,
        kind,
        default: Some(default),
    }
}

/// What a UDF accepts.
#[derive(Debug, Clone, Copy)]
pub struct ArgSpec {
    /// SQL name.
    pub name: &'static str,
    /// Parameters in order; required ones first.
    pub params: &'static [Param],
    /// Takes hidden `seed, epoch`.
    pub random: bool,
    /// Takes a hidden `key`, and follows the bad-sample policy.
    pub keyed: bool,
}

impl ArgSpec {
    /// Parameters a call must give.
    pub fn required(&self) -> usize {
        self.params.iter().filter(|p| p.default.is_none()).count()
    }

    /// Length of the full argument list.
    pub fn full_len(&self) -> usize {
        self.params.len() + 2 * usize::from(self.random) + usize::from(self.keyed)
    }

    /// Index of the hidden seed (epoch follows).
    pub fn seed_index(&self) -> Option<usize> {
        self.random.then_some(self.params.len())
    }

    /// Index of the hidden key.
    pub fn key_index(&self) -> Option<usize> {
        self.keyed.then(|| self.full_len() - 1)
    }

    /// `name(a, b, [c])`: the parameters a call may give.
    pub fn usage(&self) -> String {
        let ps: Vec<String> = self
            .params
            .iter()
            .map(|p| match p.default {
                None => p.name.to_owned(),
                Some(_) => format!("[{}]", p.name),
            })
            .collect();
        format!("{}({})", self.name, ps.join(", "))
    }

    /// Type coercion for a call with `types`: a prefix of the parameters, or the full list.
    pub fn coerce(&self, types: &[DataType]) -> Result<Vec<DataType>> {
        let n = types.len();
        if n < self.required() || (n > self.params.len() && n != self.full_len()) {
            return Err(DataFusionError::Plan(format!(
                "{} takes {} to {} arguments, got {n}: {}",
                self.name,
                self.required(),
                self.params.len(),
                self.usage()
            )));
        }
        types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let kind = match self.params.get(i) {
                    Some(p) => p.kind,
                    None if Some(i) == self.key_index() => Kind::Str,
                    None => Kind::Int,
                };
                let name = self.params.get(i).map_or("hidden argument", |p| p.name);
                coerce_one(self.name, name, kind, t)
            })
            .collect()
    }

    /// Completes a user's argument list: defaults, then the hidden arguments.
    pub fn complete(&self, mut args: Vec<Expr>, seed: u64, epoch: u64, key: Expr) -> Vec<Expr> {
        if args.len() >= self.full_len() {
            return args;
        }
        for p in &self.params[args.len().min(self.params.len())..] {
            if let Some(d) = p.default {
                args.push(d.expr());
            }
        }
        if self.random {
            args.push(lit(seed as i64));
            args.push(lit(epoch as i64));
        }
        if self.keyed {
            args.push(key);
        }
        args
    }

    /// Whether `n` arguments are already the full list.
    pub fn is_complete(&self, n: usize) -> bool {
        n == self.full_len()
    }
}

fn coerce_one(udf: &str, name: &str, kind: Kind, t: &DataType) -> Result<DataType> {
    use DataType as D;
    let numeric = t.is_numeric() || t == &D::Null;
    let stringy = matches!(t, D::Utf8 | D::LargeUtf8 | D::Utf8View | D::Null);
    let ok = match kind {
        Kind::Value => return Ok(t.clone()),
        Kind::Int if t.is_integer() || t == &D::Null => D::Int64,
        Kind::Float if numeric => D::Float64,
        Kind::Str if stringy => D::Utf8,
        Kind::IntOrStr if stringy => D::Utf8,
        Kind::IntOrStr if t.is_integer() => D::Int64,
        Kind::Floats if numeric => D::Float64,
        Kind::Floats => match t {
            D::List(f) | D::LargeList(f) | D::FixedSizeList(f, _) if f.data_type().is_numeric() => {
                D::List(Arc::new(Field::new_list_field(D::Float64, true)))
            }
            _ => return Err(bad_type(udf, name, "a number or a list of numbers", t)),
        },
        Kind::Int => return Err(bad_type(udf, name, "an integer", t)),
        Kind::Float => return Err(bad_type(udf, name, "a number", t)),
        Kind::Str => return Err(bad_type(udf, name, "a string", t)),
        Kind::IntOrStr => return Err(bad_type(udf, name, "an integer or a string", t)),
    };
    Ok(ok)
}

fn bad_type(udf: &str, name: &str, want: &str, got: &DataType) -> DataFusionError {
    DataFusionError::Plan(format!("{udf}: argument {name} must be {want}, got {got}"))
}

/// The constant arguments of a call, with defaults for those not given.
#[derive(Debug, Clone)]
pub struct Consts {
    spec: ArgSpec,
    values: Vec<Option<ScalarValue>>,
}

impl Consts {
    /// From the planner's view of a call.
    pub fn from_plan(spec: ArgSpec, args: &ReturnFieldArgs<'_>) -> Self {
        Self {
            spec,
            values: args.scalar_arguments.iter().map(|s| s.cloned()).collect(),
        }
    }

    /// From an invocation.
    pub fn from_call(spec: ArgSpec, args: &[ColumnarValue]) -> Self {
        Self {
            spec,
            values: args
                .iter()
                .map(|a| match a {
                    ColumnarValue::Scalar(s) => Some(s.clone()),
                    ColumnarValue::Array(_) => None,
                })
                .collect(),
        }
    }

    /// From literal values (kernels' callers, tests and cost estimates).
    pub fn from_values(spec: ArgSpec, values: Vec<Option<ScalarValue>>) -> Self {
        Self { spec, values }
    }

    fn get(&self, i: usize) -> Result<ScalarValue> {
        let p = &self.spec.params[i];
        match self.values.get(i) {
            Some(Some(v)) if !v.is_null() => Ok(v.clone()),
            Some(Some(_)) => Err(self.err(i, "must not be NULL")),
            Some(None) => Err(self.err(i, "must be a constant")),
            None => p
                .default
                .map(Lit::scalar)
                .ok_or_else(|| self.err(i, "is missing")),
        }
    }

    /// Whether parameter `i` is known: a literal, or left to its default.
    /// (An expression such as `make_array(0.5, 0.5)` becomes a literal only
    /// once the optimizer folds it, after the plan's types are computed.)
    pub fn is_known(&self, i: usize) -> bool {
        !matches!(self.values.get(i), Some(None))
    }

    /// The UDF's name.
    pub fn name(&self) -> &'static str {
        self.spec.name
    }

    fn err(&self, i: usize, what: &str) -> DataFusionError {
        DataFusionError::Plan(format!(
            "{}: argument {} {what}",
            self.spec.name, self.spec.params[i].name
        ))
    }

    /// Parameter `i` as an integer.
    pub fn int(&self, i: usize) -> Result<i64> {
        match self.get(i)?.cast_to(&DataType::Int64)? {
            ScalarValue::Int64(Some(v)) => Ok(v),
            _ => Err(self.err(i, "must be an integer")),
        }
    }

    /// Parameter `i` as a positive size that fits in u32.
    pub fn size(&self, i: usize) -> Result<u32> {
        let v = self.int(i)?;
        u32::try_from(v)
            .ok()
            .filter(|v| (1..=1 << 20).contains(v))
            .ok_or_else(|| self.err(i, &format!("must be in 1..=1048576, got {v}")))
    }

    /// Parameter `i` as a number.
    pub fn float(&self, i: usize) -> Result<f64> {
        match self.get(i)?.cast_to(&DataType::Float64)? {
            ScalarValue::Float64(Some(v)) if v.is_finite() => Ok(v),
            _ => Err(self.err(i, "must be a finite number")),
        }
    }

    /// Parameter `i` as a string.
    pub fn str(&self, i: usize) -> Result<String> {
        match self.get(i)? {
            ScalarValue::Utf8(Some(v))
            | ScalarValue::LargeUtf8(Some(v))
            | ScalarValue::Utf8View(Some(v)) => Ok(v),
            _ => Err(self.err(i, "must be a string")),
        }
    }

    /// Parameter `i` as a string parsed by `parse`.
    pub fn parsed<T>(&self, i: usize, parse: impl FnOnce(&str) -> Result<T, String>) -> Result<T> {
        let text = match self.get(i)? {
            ScalarValue::Int64(Some(v)) => v.to_string(),
            _ => self.str(i)?,
        };
        parse(&text).map_err(|e| self.err(i, &format!("is invalid: {e}")))
    }

    /// Parameter `i` as a list of numbers (a single number is a list of one).
    pub fn floats(&self, i: usize) -> Result<Vec<f64>> {
        let v = self.get(i)?;
        let arr: ArrayRef = match v {
            ScalarValue::List(l) => l.value(0),
            ScalarValue::LargeList(l) => l.value(0),
            ScalarValue::FixedSizeList(l) => l.value(0),
            other => {
                return Ok(vec![
                    Self::from_values(self.spec, vec![Some(other)]).float(0)?,
                ]);
            }
        };
        let arr = arrow::compute::cast(&arr, &DataType::Float64)?;
        let arr = arr.as_primitive::<arrow::datatypes::Float64Type>();
        if arr.null_count() > 0 || arr.is_empty() {
            return Err(self.err(i, "must be a non-empty list of numbers"));
        }
        Ok(arr.values().to_vec())
    }

    /// Hidden seed and epoch, when the call has them.
    pub fn seed_epoch(&self) -> Option<(u64, u64)> {
        let i = self.spec.seed_index()?;
        let as_u64 = |v: &Option<ScalarValue>| match v {
            Some(ScalarValue::Int64(Some(v))) => Some(*v as u64),
            _ => None,
        };
        Some((
            as_u64(self.values.get(i)?)?,
            as_u64(self.values.get(i + 1)?)?,
        ))
    }
}

/// One invocation: arguments, rows, and the session's policy.
#[derive(Debug)]
pub struct Call<'a> {
    /// The UDF's spec.
    pub spec: ArgSpec,
    /// Constant arguments.
    pub consts: Consts,
    args: &'a [ColumnarValue],
    /// Fields of the arguments.
    pub fields: &'a [FieldRef],
    /// The result field.
    pub return_field: &'a FieldRef,
    /// Rows in the batch.
    pub rows: usize,
    env: &'a UdfEnv,
    keys: Option<ArrayRef>,
}

impl<'a> Call<'a> {
    /// Wraps DataFusion's arguments.
    pub fn new(spec: ArgSpec, args: &'a ScalarFunctionArgs, env: &'a UdfEnv) -> Result<Self> {
        let keys = match spec.key_index() {
            Some(i) if args.args.len() == spec.full_len() => {
                let k = args.args[i].to_array(args.number_rows)?;
                Some(arrow::compute::cast(&k, &DataType::Utf8)?)
            }
            _ => None,
        };
        Ok(Self {
            spec,
            consts: Consts::from_call(spec, &args.args),
            args: &args.args,
            fields: &args.arg_fields,
            return_field: &args.return_field,
            rows: args.number_rows,
            env,
            keys,
        })
    }

    /// Argument `i` as an array of `rows` values.
    pub fn array(&self, i: usize) -> Result<ArrayRef> {
        self.args[i].to_array(self.rows)
    }

    /// The key of `row`, or `row N` when no key is in scope.
    pub fn key(&self, row: usize) -> String {
        match &self.keys {
            Some(k) if !k.is_null(row) => k.as_string::<i32>().value(row).to_owned(),
            _ => format!("row {row}"),
        }
    }

    /// The generator of `row`'s draws. Fails when the call lacks its hidden arguments.
    pub fn rng(&self, row: usize) -> Result<SampleRng> {
        self.rng_for(row, self.spec.name)
    }

    /// The generator of `row`'s draws under another UDF's name (a fused UDF
    /// draws what its unfused form would).
    pub fn rng_for(&self, row: usize, salt: &str) -> Result<SampleRng> {
        let (seed, epoch) = self.consts.seed_epoch().ok_or_else(|| {
            DataFusionError::Execution(format!(
                "{} was called without its hidden seed/epoch/key arguments; \
                 register sluice's rewrite rule (sluice_udfs::register)",
                self.spec.name
            ))
        })?;
        let key = match &self.keys {
            Some(k) if !k.is_null(row) => k.as_string::<i32>().value(row),
            _ => {
                return Err(DataFusionError::Execution(format!(
                    "{} needs the sample key: query a dataset's `key` column in the same SELECT",
                    self.spec.name
                )));
            }
        };
        Ok(SampleRng::new(seed, epoch, key, salt))
    }

    /// Applies the policy to a bad sample: an error under `fail`, else logs it
    /// (the caller appends NULL).
    ///
    /// Once the query is cancelled, a failing row is no bad sample (the
    /// kernel may have stopped on the cancel): the batch ends with the
    /// cancel's error and nothing is logged.
    pub fn bad(&self, row: usize, reason: String) -> Result<()> {
        self.live()?;
        let key = self.key(row);
        match self.env.options.on_error {
            OnError::Fail => Err(BadSample {
                udf: self.spec.name.to_owned(),
                key,
                reason,
            }
            .into_error()),
            OnError::Skip | OnError::Null => {
                self.env.errors.record(BadSample {
                    udf: self.spec.name.to_owned(),
                    key,
                    reason,
                });
                Ok(())
            }
        }
    }

    /// The session's decoding limits.
    pub fn limits(&self) -> crate::env::Limits {
        self.env.options.limits
    }

    /// The session's cancel flag, for decode loops to check.
    pub fn cancel(&self) -> &crate::env::Cancel {
        &self.env.cancel
    }

    /// An error once the query is cancelled: the UDFs call it before each
    /// row, so a cancelled batch stops within one row's work.
    pub fn live(&self) -> Result<()> {
        self.env
            .cancel
            .check()
            .map_err(|e| DataFusionError::Execution(format!("{}: {e}", self.spec.name)))
    }
}
