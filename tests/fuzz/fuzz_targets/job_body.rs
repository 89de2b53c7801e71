//! Any bytes as the JSON body of `POST /v1/jobs`: parsed and validated as
//! the REST handler does. A plan given as data must compile to one SQL
//! statement that parses.
#![no_main]

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use libfuzzer_sys::fuzz_target;
use sluice_compute::JobSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = serde_json::from_slice::<JobSpec>(data) else {
        return;
    };
    let Ok(sql) = spec.validate() else {
        return;
    };
    if spec.sql.is_none() {
        let parsed = Parser::parse_sql(&GenericDialect {}, &sql)
            .unwrap_or_else(|e| panic!("a plan compiled to SQL that does not parse: {sql}: {e}"));
        assert_eq!(
            parsed.len(),
            1,
            "a plan compiled to {} statements: {sql}",
            parsed.len()
        );
    }
});
