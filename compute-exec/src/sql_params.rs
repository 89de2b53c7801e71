//! Parameters of a prepared statement (Flight SQL's, as ADBC binds them):
//! `?` and `$n` placeholders replaced by literals.
//!
//! A statement's handle is the statement itself (`crate::flight_sql`):
//! nothing is kept per statement on the server. Binding therefore makes a
//! new statement: the SQL is parsed, each placeholder in the parse tree is
//! replaced by the literal DataFusion's unparser writes for its value
//! (`?` in the order they appear, `$n` by number), and the tree is written
//! back as SQL. The values enter as literals of the syntax tree, never as
//! text pasted into the statement, so a string holding `'; DROP …` is a
//! string.

use std::ops::ControlFlow;

use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::Expr;
use datafusion::sql::sqlparser::ast::{self, Value, visit_expressions, visit_expressions_mut};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::unparser::Unparser;

/// Most parameters a statement may take.
pub const MAX_PARAMETERS: usize = 1024;

/// How many placeholders `sql` has (0 where it does not parse).
pub fn placeholders(sql: &str) -> usize {
    let Ok(statements) = Parser::parse_sql(&GenericDialect {}, sql) else {
        return 0;
    };
    let mut n = 0;
    for s in &statements {
        let _ = visit_expressions(s, |e: &ast::Expr| {
            if matches!(e, ast::Expr::Value(v) if matches!(v.value, Value::Placeholder(_))) {
                n += 1;
            }
            ControlFlow::<()>::Continue(())
        });
    }
    n
}

/// `sql` with its placeholders replaced by `values` (see the module docs).
pub fn bind(sql: &str, values: &[ScalarValue]) -> Result<String> {
    if values.len() > MAX_PARAMETERS {
        return Err(DataFusionError::Plan(format!(
            "{} parameters, over the {MAX_PARAMETERS} a statement may take",
            values.len()
        )));
    }
    let mut statements = Parser::parse_sql(&GenericDialect {}, sql)
        .map_err(|e| DataFusionError::Plan(format!("cannot bind parameters: {e}")))?;
    let unparser = Unparser::default();
    let literals = values
        .iter()
        .map(|v| unparser.expr_to_sql(&Expr::Literal(v.clone(), None)))
        .collect::<Result<Vec<_>>>()?;
    let mut next = 0usize;
    let mut failed = None;
    for s in &mut statements {
        let _ = visit_expressions_mut(s, |e: &mut ast::Expr| {
            let ast::Expr::Value(v) = e else {
                return ControlFlow::Continue(());
            };
            let Value::Placeholder(p) = &v.value else {
                return ControlFlow::Continue(());
            };
            let at = match p.strip_prefix('$').map(str::parse::<usize>) {
                Some(Ok(n)) if n >= 1 => n - 1,
                Some(_) => {
                    failed = Some(format!("placeholder {p} is not $1, $2, …"));
                    return ControlFlow::Break(());
                }
                None => {
                    next += 1;
                    next - 1
                }
            };
            match literals.get(at) {
                Some(literal) => {
                    *e = literal.clone();
                    ControlFlow::Continue(())
                }
                None => {
                    failed = Some(format!(
                        "placeholder {p} has no value: {} given",
                        literals.len()
                    ));
                    ControlFlow::Break(())
                }
            }
        });
    }
    if let Some(why) = failed {
        return Err(DataFusionError::Plan(why));
    }
    if next > 0 && next != literals.len() {
        return Err(DataFusionError::Plan(format!(
            "{next} placeholders `?` and {} values",
            literals.len()
        )));
    }
    Ok(statements
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_become_literals_of_the_tree() {
        let sql = "SELECT key FROM pets WHERE label = ? AND length > ?";
        assert_eq!(placeholders(sql), 2);
        let bound = bind(
            sql,
            &[ScalarValue::from("cat's"), ScalarValue::Int64(Some(10))],
        )
        .unwrap();
        assert_eq!(
            bound,
            "SELECT key FROM pets WHERE label = 'cat''s' AND length > 10"
        );
        let bound = bind(
            "SELECT $2, $1",
            &[ScalarValue::Int32(Some(1)), ScalarValue::Utf8(None)],
        )
        .unwrap();
        assert_eq!(bound, "SELECT NULL, 1");
        // An injection attempt stays one string.
        let bound = bind("SELECT ?", &[ScalarValue::from("'; DROP TABLE pets; --")]).unwrap();
        assert_eq!(placeholders(&bound), 0);
        assert_eq!(bound, "SELECT '''; DROP TABLE pets; --'");
    }

    #[test]
    fn the_wrong_number_of_values_is_an_error_naming_it() {
        let e = bind("SELECT ?, ?", &[ScalarValue::Int64(Some(1))]).unwrap_err();
        assert!(e.to_string().contains("no value"), "{e}");
        let e = bind(
            "SELECT ?",
            &[ScalarValue::Int64(Some(1)), ScalarValue::Int64(Some(2))],
        )
        .unwrap_err();
        assert!(e.to_string().contains("1 placeholders"), "{e}");
        assert_eq!(placeholders("SELECT 1"), 0);
    }
}
