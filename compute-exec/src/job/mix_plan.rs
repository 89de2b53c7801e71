//! A mixture's window plan: each part's placed plan with its name as a
//! `source` column, under one union, and each window's takes handed to
//! the part they belong to.
//!
//! ```text
//!  UnionExec
//!   ├─ ProjectionExec [.., source = 'a']  ◄─ part a's placed plan (its fragments take part a's rows)
//!   └─ ProjectionExec [.., source = 'b']  ◄─ part b's placed plan
//! ```
//!
//! Every part keeps its own placement (calibrated at submit); the rows
//! come back by slot as for one pipeline, so the stages above the fetch
//! (in order, rebatch, finish, the sinks) see one stream.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{Column, Literal};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::union::UnionExec;

use crate::remote::{Takes, with_takes};

/// The column each row of a mixture names its part in.
pub const SOURCE: &str = "source";

/// The field of [`SOURCE`].
pub fn source_field() -> Field {
    Field::new(SOURCE, DataType::Utf8, false)
}

/// `placed` (a part's plan) with its part's `name` as a last column.
fn named(placed: Arc<dyn ExecutionPlan>, name: &str) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = placed.schema();
    let mut exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            (
                Arc::new(Column::new(f.name(), i)) as Arc<dyn PhysicalExpr>,
                f.name().clone(),
            )
        })
        .collect();
    exprs.push((
        Arc::new(Literal::new(ScalarValue::Utf8(Some(name.to_string())))),
        SOURCE.to_string(),
    ));
    Ok(Arc::new(ProjectionExec::try_new(exprs, placed)?))
}

/// The mixture's plan: each of `parts` (name, placed plan) named, under
/// one union.
pub fn union_of(parts: Vec<(String, Arc<dyn ExecutionPlan>)>) -> Result<Arc<dyn ExecutionPlan>> {
    let inputs = parts
        .into_iter()
        .map(|(name, placed)| named(placed, &name))
        .collect::<Result<Vec<_>>>()?;
    UnionExec::try_new(inputs)
}

/// `plan` with each part's fragments reading that part's `takes` (one
/// part: the plan itself; a mixture: the union's inputs in order).
pub fn with_part_takes(
    plan: Arc<dyn ExecutionPlan>,
    takes: &[Takes],
) -> Result<Arc<dyn ExecutionPlan>> {
    if let [one] = takes {
        return with_takes(plan, one);
    }
    let inputs = plan
        .children()
        .into_iter()
        .zip(takes)
        .map(|(input, takes)| with_takes(Arc::clone(input), takes))
        .collect::<Result<Vec<_>>>()?;
    replace_children_if_necessary(plan, inputs)
}
