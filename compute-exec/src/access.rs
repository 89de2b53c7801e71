//! What a caller may read through the compute side: the datasets a SQL
//! statement names, the dataset a job reads, the checkpoints a call
//! names. Each answer is `Err(why)` for the service to audit and refuse
//! (`PermissionDenied` over Flight, 403 over REST).
//!
//! A statement's datasets are read off its parse tree
//! (DataFusion's `resolve_table_references`: every relation, CTEs set
//! apart), before anything is planned or any node is asked: a refused
//! statement costs a parse. DataFusion's own table functions
//! (`generate_series`, `range`) read no dataset. `information_schema`
//! lists every dataset, so it is for tokens whose datasets are `*`.

use datafusion::sql::parser::DFParser;
use datafusion::sql::resolve::resolve_table_references;
use sluice_access::Grant;

/// Relations that are DataFusion's table functions, not datasets.
const TABLE_FUNCTIONS: [&str; 2] = ["generate_series", "range"];

/// Whether `who` may run `sql`: every dataset it names readable. A
/// statement that does not parse is let through, for the planner to
/// word its error.
pub fn may_query(who: &Grant, sql: &str) -> Result<(), String> {
    if who.every_dataset() && who.has(sluice_access::Scope::Read) {
        return Ok(());
    }
    let Ok(statements) = DFParser::parse_sql(sql) else {
        return Ok(());
    };
    for statement in &statements {
        let Ok((relations, _ctes)) = resolve_table_references(statement, true) else {
            return Ok(());
        };
        for r in relations {
            if r.schema() == Some("information_schema") {
                if !who.every_dataset() {
                    return Err(format!(
                        "token {:?} may not list every dataset (information_schema)",
                        who.name()
                    ));
                }
                continue;
            }
            let table = r.table();
            if r.schema().is_none() && TABLE_FUNCTIONS.contains(&table) {
                continue;
            }
            may_read(who, table)?;
        }
    }
    Ok(())
}

/// Whether `who` may read `dataset` (a name, or `name@version`): the one
/// wording of that refusal, over REST and Flight alike.
pub fn may_read(who: &Grant, dataset: &str) -> Result<(), String> {
    if who.may_read(dataset) {
        Ok(())
    } else {
        Err(format!(
            "token {:?} may not read dataset {dataset:?}",
            who.name()
        ))
    }
}

/// Whether `who` may read the streams, status and plan of job `job`,
/// which reads `datasets` (`Job::may_be_read_by`).
pub fn may_read_job<'a>(
    who: &Grant,
    job: &str,
    mut datasets: impl Iterator<Item = &'a str>,
) -> Result<(), String> {
    match datasets.find(|d| !who.may_read(d)) {
        None => Ok(()),
        Some(dataset) => Err(format!(
            "token {:?} may not read job {job} (it reads dataset {dataset:?})",
            who.name(),
        )),
    }
}

/// Whether `who` may touch checkpoint `name` (a name, or a prefix when
/// listing).
pub fn may_checkpoint(who: &Grant, name: &str) -> Result<(), String> {
    if who.may_checkpoint(name) {
        Ok(())
    } else {
        Err(format!(
            "token {:?} may not use checkpoint {name:?}",
            who.name()
        ))
    }
}

/// The checkpoint a checkpoint action's body names (`name`, or `prefix`
/// for a listing); `None` for the actions on an upload, whose id only the
/// caller of a checked `checkpoint.begin` was given.
pub fn checkpoint_of_action(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("name")
        .or_else(|| v.get("prefix"))
        .map(|n| n.as_str().unwrap_or_default().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_access::Scope;

    fn reader(datasets: &[&str]) -> Grant {
        Grant::new(
            "r",
            [Scope::Read],
            datasets.iter().map(|d| d.to_string()).collect(),
            vec!["r/".into()],
        )
    }

    #[test]
    fn a_statement_may_name_only_the_datasets_of_its_token() {
        let r = reader(&["pets*"]);
        for ok in [
            "SELECT count(*) FROM pets",
            "SELECT * FROM \"pets@3\"",
            "SELECT * FROM pets2 WHERE key IN (SELECT key FROM pets)",
            "WITH t AS (SELECT * FROM pets) SELECT * FROM t",
            "SELECT * FROM generate_series(1, 3)",
            "SELECT 1",
            "SELEC nonsense",
        ] {
            assert_eq!(may_query(&r, ok), Ok(()), "{ok}");
        }
        for (bad, needle) in [
            ("SELECT * FROM cats", "\"cats\""),
            ("SELECT * FROM pets JOIN cats USING (key)", "\"cats\""),
            (
                "SELECT * FROM pets WHERE key IN (SELECT key FROM cats)",
                "\"cats\"",
            ),
            ("EXPLAIN SELECT * FROM cats", "\"cats\""),
            (
                "SELECT * FROM information_schema.tables",
                "information_schema",
            ),
        ] {
            let e = may_query(&r, bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        assert_eq!(
            may_query(&reader(&["*"]), "SELECT * FROM information_schema.tables"),
            Ok(())
        );
        let node = Grant::new("n", [Scope::Node], vec!["*".into()], vec![]);
        assert!(may_query(&node, "SELECT * FROM pets").is_err());
    }

    #[test]
    fn checkpoint_actions_name_their_checkpoint() {
        assert_eq!(
            checkpoint_of_action(br#"{"name": "r/step-1"}"#).as_deref(),
            Some("r/step-1")
        );
        assert_eq!(
            checkpoint_of_action(br#"{"prefix": ""}"#).as_deref(),
            Some("")
        );
        assert_eq!(checkpoint_of_action(br#"{"upload": "u-1"}"#), None);
        let r = reader(&["*"]);
        assert!(may_checkpoint(&r, "r/step-1").is_ok());
        assert!(may_checkpoint(&r, "").is_err(), "listing every checkpoint");
    }
}
