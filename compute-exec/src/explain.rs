//! SQL `EXPLAIN` of a placed query: the planner's reasoning, then the
//! physical compute fragment.

use std::sync::Arc;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::Result;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use sluice_planner::Explanation;

/// The query inside `EXPLAIN query`, if `sql` is one (plain `EXPLAIN`
/// only; `EXPLAIN ANALYZE` and `VERBOSE` are left to DataFusion).
pub fn explained(sql: &str) -> Option<&str> {
    let t = sql.trim_start();
    let head = t.get(..7)?;
    if !head.eq_ignore_ascii_case("explain") {
        return None;
    }
    let rest = &t[7..];
    if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let rest = rest.trim_start();
    let word = rest.split_whitespace().next().unwrap_or("");
    if word.eq_ignore_ascii_case("analyze") || word.eq_ignore_ascii_case("verbose") {
        return None;
    }
    Some(rest)
}

/// The schema of an `EXPLAIN`'s rows.
pub fn explain_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("plan_type", DataType::Utf8, false),
        Field::new("plan", DataType::Utf8, false),
    ]))
}

/// The rows of an `EXPLAIN`: `placement` (the planner's text) and
/// `compute_plan` (the physical compute fragment).
pub fn explain_batch(e: &Explanation, plan: &Arc<dyn ExecutionPlan>) -> Result<RecordBatch> {
    // A plan on the distributed engine shows its stages, tasks and nodes.
    let physical = crate::engine::describe(plan)
        .unwrap_or_else(|| displayable(plan.as_ref()).indent(true).to_string());
    Ok(RecordBatch::try_new(
        explain_schema(),
        vec![
            Arc::new(StringArray::from(vec!["placement", "compute_plan"])),
            Arc::new(StringArray::from(vec![e.to_text(), physical])),
        ],
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_prefix() {
        assert_eq!(explained("  EXPLAIN SELECT 1"), Some("SELECT 1"));
        assert_eq!(explained("explain\nselect 1"), Some("select 1"));
        assert_eq!(explained("EXPLAIN ANALYZE SELECT 1"), None);
        assert_eq!(explained("EXPLAINED"), None);
        assert_eq!(explained("SELECT 1"), None);
    }
}
