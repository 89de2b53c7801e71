//! Any bytes as the JSON body of `POST /v1/jobs`: parsed and validated as
//! the REST handler does. A plan given as data (the job's, or a mixture
//! part's) must compile to one SQL statement that parses, and so must a
//! pipeline made to read a mixture part's dataset.
#![no_main]

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use libfuzzer_sys::fuzz_target;
use sluice_compute::JobSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = serde_json::from_slice::<JobSpec>(data) else {
        return;
    };
    let Ok(parts) = spec.validate() else {
        return;
    };
    // SQL as the user wrote it is the planner's to refuse; what sluice
    // made must parse.
    let written: Vec<&str> = spec
        .sql
        .iter()
        .chain(spec.mix.iter().flatten().filter_map(|p| p.sql.as_ref()))
        .map(String::as_str)
        .collect();
    for part in parts.iter().filter(|p| !written.contains(&p.sql.as_str())) {
        let sql = &part.sql;
        let parsed = Parser::parse_sql(&GenericDialect {}, sql)
            .unwrap_or_else(|e| panic!("sluice made SQL that does not parse: {sql}: {e}"));
        assert_eq!(
            parsed.len(),
            1,
            "sluice made {} statements: {sql}",
            parsed.len()
        );
    }
});
