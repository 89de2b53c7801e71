//! The plan form of a pipeline: the same pipeline as SQL, written as data
//! (YAML or JSON) — a source, filters, a list of stages and the outputs.
//! It compiles to SQL text, which the session plans like any query, so a
//! plan and the SQL it stands for give the same logical plan.
//!
//! ```yaml
//! source: pets                 # a dataset (or `pets@2`)
//! filters:                     # SQL predicates, ANDed
//!   - "width >= 64"
//! stages:                      # UDF calls; an argument names a column or
//!   - name: image              # an earlier stage, or is a literal
//!     udf: decode_resize
//!     args: [data, 224, 224]
//!   - name: pixels
//!     udf: normalize
//!     args: [image, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]]
//! outputs: [key, label, pixels]
//! ```
//!
//! A string argument is a column or stage name; `{lit: "text"}` is a
//! string literal; numbers and booleans are literals; a list of numbers is
//! an array literal.

use std::collections::HashMap;

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;
use serde::{Deserialize, Serialize};

use super::JobError;
use super::mix::MixEpoch;

/// A pipeline as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    /// The dataset read.
    pub source: String,
    /// SQL predicates every output row satisfies.
    #[serde(default)]
    pub filters: Vec<String>,
    /// The UDF calls, in order.
    #[serde(default)]
    pub stages: Vec<Stage>,
    /// The columns and stages returned, in order.
    pub outputs: Vec<String>,
    /// A weighted mixture (see `JobSpec::mix`): parts that name a dataset
    /// run this plan with its source replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix: Option<Vec<MixPart>>,
    /// What ends a mixture's epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix_epoch: Option<MixEpoch>,
}

/// One part of a mixture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MixPart {
    /// The dataset the job's pipeline reads for this part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// This part's own pipeline as SQL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
    /// This part's own pipeline as a plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(no_recursion)]
    pub plan: Option<PlanInput>,
    /// Its weight (positive; the weights need not add up to 1).
    pub weight: f64,
    /// Its name in the `source` column (default: its dataset's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A plan as an object or as YAML text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum PlanInput {
    /// YAML (or JSON) text.
    Text(String),
    /// The plan itself.
    Plan(PlanSpec),
}

impl PlanInput {
    /// The plan.
    pub fn parsed(&self) -> Result<PlanSpec, JobError> {
        match self {
            Self::Plan(p) => Ok(p.clone()),
            Self::Text(t) => PlanSpec::from_yaml(t),
        }
    }
}

/// One UDF call of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Its output's name.
    pub name: String,
    /// The function called.
    pub udf: String,
    /// Its arguments.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub args: Vec<serde_json::Value>,
}

fn identifier(what: &str, s: &str) -> Result<String, JobError> {
    let ok = !s.is_empty()
        && s.chars().enumerate().all(|(i, c)| {
            c == '_' || c.is_ascii_alphabetic() || (i > 0 && (c.is_ascii_digit() || c == '@'))
        });
    if ok {
        Ok(format!("\"{s}\""))
    } else {
        Err(JobError::InvalidPlan(format!(
            "{what} {s:?} is not a name (letters, digits and '_')"
        )))
    }
}

fn literal_string(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl PlanSpec {
    /// Parses a plan written in YAML (or JSON, which is YAML).
    pub fn from_yaml(text: &str) -> Result<Self, JobError> {
        serde_yaml::from_str(text).map_err(|e| JobError::InvalidPlan(e.to_string()))
    }

    /// The SQL this plan stands for.
    pub fn to_sql(&self) -> Result<String, JobError> {
        let source = identifier("source", &self.source)?;
        let mut exprs: HashMap<&str, String> = HashMap::new();
        for (i, stage) in self.stages.iter().enumerate() {
            let at = |msg: String| {
                JobError::InvalidPlan(format!("stage {} ({}): {msg}", i + 1, stage.name))
            };
            identifier("stage", &stage.name).map_err(|e| at(e.to_string()))?;
            let udf = identifier("udf", &stage.udf).map_err(|e| at(e.to_string()))?;
            if exprs.contains_key(stage.name.as_str()) {
                return Err(at("a stage of that name comes earlier".into()));
            }
            let mut args = Vec::with_capacity(stage.args.len());
            for a in &stage.args {
                args.push(argument(a, &exprs).map_err(&at)?);
            }
            let call = format!("{}({})", udf.trim_matches('"'), args.join(", "));
            exprs.insert(stage.name.as_str(), call);
        }
        if self.outputs.is_empty() {
            return Err(JobError::InvalidPlan("outputs: name at least one".into()));
        }
        let mut select = Vec::with_capacity(self.outputs.len());
        for o in &self.outputs {
            let name = identifier("output", o)?;
            select.push(match exprs.get(o.as_str()) {
                Some(e) => format!("{e} AS {name}"),
                None => name,
            });
        }
        let mut sql = format!("SELECT {} FROM {source}", select.join(", "));
        if !self.filters.is_empty() {
            let preds = self
                .filters
                .iter()
                .enumerate()
                .map(|(i, f)| predicate(i, f).map(|p| format!("({p})")))
                .collect::<Result<Vec<String>, JobError>>()?;
            sql.push_str(" WHERE ");
            sql.push_str(&preds.join(" AND "));
        }
        Ok(sql)
    }
}

/// Filter `i`, checked to be one SQL expression and written back from its
/// syntax tree: a filter that does not parse is refused by number, and
/// none can close its parentheses and add SQL of its own
/// (`"x) OR (1=1"`).
fn predicate(i: usize, text: &str) -> Result<String, JobError> {
    let bad = |e: String| JobError::InvalidPlan(format!("filter {} ({text:?}): {e}", i + 1));
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect)
        .try_with_sql(text)
        .map_err(|e| bad(e.to_string()))?;
    let expr = parser.parse_expr().map_err(|e| bad(e.to_string()))?;
    let rest = parser.peek_token();
    if rest.token != Token::EOF {
        return Err(bad(format!(
            "one SQL expression was expected; text follows it at {}",
            rest.span.start
        )));
    }
    Ok(expr.to_string())
}

fn argument(a: &serde_json::Value, stages: &HashMap<&str, String>) -> Result<String, String> {
    use serde_json::Value;
    match a {
        Value::String(s) => match stages.get(s.as_str()) {
            Some(e) => Ok(e.clone()),
            None => identifier("argument", s).map_err(|e| e.to_string()),
        },
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Array(items) => {
            let parts: Result<Vec<String>, String> = items
                .iter()
                .map(|v| match v {
                    Value::Number(n) => Ok(n.to_string()),
                    other => Err(format!("array arguments hold numbers, not {other}")),
                })
                .collect();
            Ok(format!("[{}]", parts?.join(", ")))
        }
        Value::Object(o) => match (o.len(), o.get("lit")) {
            (1, Some(Value::String(s))) => Ok(literal_string(s)),
            _ => Err(format!("an object argument is {{lit: \"text\"}}, not {a}")),
        },
        Value::Null => Err("null is not an argument".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_stages_inline_in_order() {
        let plan = PlanSpec::from_yaml(
            r#"
source: pets
filters: ["width >= 64", "label <> 'dog'"]
stages:
  - {name: image, udf: decode_resize, args: [data, 224, 224]}
  - {name: pixels, udf: normalize, args: [image, [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]]}
  - {name: mode, udf: decode_video, args: [data, 4, 8, 8, {lit: "it's"}]}
outputs: [key, pixels, mode]
"#,
        )
        .unwrap();
        assert_eq!(
            plan.to_sql().unwrap(),
            "SELECT \"key\", normalize(decode_resize(\"data\", 224, 224), [0.5, 0.5, 0.5], \
             [0.25, 0.25, 0.25]) AS \"pixels\", decode_video(\"data\", 4, 8, 8, 'it''s') AS \"mode\" \
             FROM \"pets\" WHERE (width >= 64) AND (label <> 'dog')"
        );
    }

    #[test]
    fn bad_plans_name_the_culprit() {
        let err = |y: &str| {
            PlanSpec::from_yaml(y)
                .and_then(|p| p.to_sql())
                .unwrap_err()
                .to_string()
        };
        assert!(err("source: pets\noutputs: []").contains("outputs"));
        assert!(err("source: pets\nsourse: x\noutputs: [key]").contains("sourse"));
        assert!(err("source: \"pets; DROP\"\noutputs: [key]").contains("pets; DROP"));
        let e = err("source: pets\nstages: [{name: a, udf: npy, args: [null]}]\noutputs: [a]");
        assert!(e.contains("stage 1 (a)") && e.contains("null"), "{e}");
        let e = err("source: pets\nstages: [{name: a, udf: npy, args: [\"x y\"]}]\noutputs: [a]");
        assert!(e.contains("\"x y\""), "{e}");
        // Found by the `plan` fuzz target: a filter that is no expression
        // made SQL that does not parse; one that closes its parentheses
        // added SQL of its own.
        let e = err("source: pets\nfilters: [\"width /= 64\"]\noutputs: [key]");
        assert!(e.contains("filter 1") && e.contains("width /= 64"), "{e}");
        let e = err("source: pets\nfilters: [\"1=1) OR (1=1\"]\noutputs: [key]");
        assert!(e.contains("filter 1") && e.contains("text follows"), "{e}");
    }
}
