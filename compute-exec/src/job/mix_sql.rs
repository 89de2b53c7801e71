//! A mixture in SQL: the pipeline reads `mix(…)` where it would read a
//! dataset, its named arguments the parts and their weights:
//!
//! ```sql
//! SELECT key, to_tensor(resize(decode_image(data), 224, 224)) AS image
//! FROM mix(web => 0.6, photos => 0.3, "synthetic@2" => 0.1, mix_epoch => 'resample')
//! ```
//!
//! is the job's SQL over `web` with `mix: [{dataset: web, weight: 0.6},
//! …]` and `mix_epoch: resample` (`'first_exhausted'`, `'resample'`, or a
//! number: that many samples an epoch). Every part runs the same
//! pipeline; parts with pipelines of their own take the `mix` option.
//! Also here: a pipeline's SQL made to read another dataset
//! ([`with_source`]), which a part naming a dataset runs.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, Ident, ObjectName, Statement, TableFactor, Value, VisitMut,
    VisitorMut, visit_relations_mut,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use super::mix::MixEpoch;
use super::plan::MixPart;
use crate::error::JobError;

/// The argument naming the epoch rule rather than a part.
const RULE: &str = "mix_epoch";

fn one_statement(sql: &str) -> Result<Statement, JobError> {
    let mut statements = Parser::parse_sql(&GenericDialect {}, sql)
        .map_err(|e| JobError::InvalidSql(e.to_string()))?;
    match statements.len() {
        1 => Ok(statements.remove(0)),
        n => Err(JobError::InvalidSql(format!(
            "a pipeline is one statement, not {n}"
        ))),
    }
}

/// `sql` reading dataset `dataset` in place of the one table it reads.
pub fn with_source(sql: &str, dataset: &str) -> Result<String, JobError> {
    let mut statement = one_statement(sql)?;
    let mut tables = 0;
    let _ = visit_relations_mut(&mut statement, |name| {
        *name = ObjectName::from(vec![Ident::with_quote('"', dataset)]);
        tables += 1;
        ControlFlow::<()>::Continue(())
    });
    if tables != 1 {
        return Err(JobError::InvalidOptions(format!(
            "a part that names a dataset reads it through the job's pipeline, which must read \
             one table ({tables} here)"
        )));
    }
    Ok(statement.to_string())
}

/// What a pipeline reading `mix(…)` names: its SQL over the first part,
/// the parts, and the rule if it gives one.
pub type SqlMix = (String, Vec<MixPart>, Option<MixEpoch>);

/// The mixture `sql` reads through `mix(…)`, if it does.
pub fn mix_in_sql(sql: &str) -> Result<Option<SqlMix>, JobError> {
    if !sql.to_ascii_lowercase().contains("mix") {
        return Ok(None);
    }
    let mut statement = one_statement(sql)?;
    let mut call = MixCall::default();
    let _ = statement.visit(&mut call);
    match call.found {
        None => Ok(None),
        Some(Err(e)) => Err(JobError::InvalidSql(format!("mix(…): {e}"))),
        Some(Ok((parts, rule))) => Ok(Some((statement.to_string(), parts, rule))),
    }
}

type Found = Result<(Vec<MixPart>, Option<MixEpoch>), String>;

/// Finds the `mix(…)` relation and makes it its first part's table.
#[derive(Default)]
struct MixCall {
    found: Option<Found>,
}

impl VisitorMut for MixCall {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table { name, args, .. } = factor else {
            return ControlFlow::Continue(());
        };
        let is_mix = name.0.len() == 1 && name.to_string().eq_ignore_ascii_case("mix");
        let Some(call) = args.as_ref().filter(|_| is_mix) else {
            return ControlFlow::Continue(());
        };
        if self.found.is_some() {
            self.found = Some(Err("a pipeline reads one mix(…)".into()));
            return ControlFlow::Break(());
        }
        let parsed = parts_of(&call.args);
        if let Ok((parts, _)) = &parsed
            && let Some(first) = parts.first().and_then(|p| p.dataset.clone())
        {
            *name = ObjectName::from(vec![Ident::with_quote('"', first)]);
            *args = None;
        }
        self.found = Some(parsed);
        ControlFlow::Continue(())
    }
}

/// The parts and rule of `mix(…)`'s arguments.
fn parts_of(args: &[FunctionArg]) -> Found {
    let mut parts = Vec::new();
    let mut rule = None;
    for arg in args {
        let FunctionArg::Named {
            name,
            arg: FunctionArgExpr::Expr(value),
            ..
        } = arg
        else {
            return Err(format!(
                "{arg}: give each part as dataset => weight (e.g. mix(web => 0.6, photos => 0.4))"
            ));
        };
        if name.value.eq_ignore_ascii_case(RULE) {
            rule = Some(rule_of(value)?);
            continue;
        }
        let weight = number(value)
            .ok_or_else(|| format!("{name} => {value}: a part's weight is a number"))?;
        parts.push(MixPart {
            dataset: Some(name.value.clone()),
            sql: None,
            plan: None,
            weight,
            name: None,
        });
    }
    if parts.is_empty() {
        return Err("no parts: give them as dataset => weight".into());
    }
    Ok((parts, rule))
}

fn number(value: &Expr) -> Option<f64> {
    match value {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

/// `mix_epoch => 'first_exhausted' | 'resample' | N`.
fn rule_of(value: &Expr) -> Result<MixEpoch, String> {
    if let Some(n) = number(value).filter(|n| *n >= 0.0 && n.fract() == 0.0) {
        return Ok(MixEpoch::Samples(n as u64));
    }
    let text = match value {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) => s.as_str(),
            _ => "",
        },
        _ => "",
    };
    match text {
        "first_exhausted" => Ok(MixEpoch::FirstExhausted),
        "resample" => Ok(MixEpoch::Resample),
        _ => Err(format!(
            "{RULE} => {value}: expected 'first_exhausted', 'resample' or a number of samples"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_in_from_names_the_parts_and_the_rule() {
        let (sql, parts, rule) = mix_in_sql(
            "SELECT key FROM mix(web => 0.6, \"photos@2\" => 0.4, mix_epoch => 'resample') \
             WHERE key <> 'x'",
        )
        .unwrap()
        .unwrap();
        assert_eq!(sql, "SELECT key FROM \"web\" WHERE key <> 'x'");
        let names: Vec<_> = parts.iter().map(|p| p.dataset.clone().unwrap()).collect();
        assert_eq!(names, ["web", "photos@2"]);
        assert_eq!(parts[1].weight, 0.4);
        assert_eq!(rule, Some(MixEpoch::Resample));
        let (_, _, rule) = mix_in_sql("SELECT key FROM mix(a => 1, mix_epoch => 500)")
            .unwrap()
            .unwrap();
        assert_eq!(rule, Some(MixEpoch::Samples(500)));
        assert!(mix_in_sql("SELECT key FROM mixes").unwrap().is_none());
        assert!(mix_in_sql("SELECT mix FROM pets").unwrap().is_none());
        for bad in [
            "SELECT key FROM mix(web, photos)",
            "SELECT key FROM mix(web => 'a lot')",
            "SELECT key FROM mix(mix_epoch => 'forever', web => 1)",
            "SELECT key FROM mix()",
        ] {
            let e = mix_in_sql(bad).unwrap_err().to_string();
            assert!(e.contains("mix(…)"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_pipeline_reads_another_dataset() {
        assert_eq!(
            with_source("SELECT key FROM pets WHERE label = 'a'", "more").unwrap(),
            "SELECT key FROM \"more\" WHERE label = 'a'"
        );
        let e = with_source("SELECT a.key FROM pets a JOIN more b ON a.key = b.key", "x");
        assert!(e.unwrap_err().to_string().contains("one table"));
    }
}
