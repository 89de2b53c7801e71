//! Any text as a YAML/JSON pipeline plan. A plan that compiles must give
//! SQL that parses, with its names and literals quoted: a plan never
//! injects SQL of its own.
#![no_main]

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use libfuzzer_sys::fuzz_target;
use sluice_compute::job::PlanSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(plan) = PlanSpec::from_yaml(text) else {
        return;
    };
    if let Ok(sql) = plan.to_sql() {
        let parsed = Parser::parse_sql(&GenericDialect {}, &sql).unwrap_or_else(|e| {
            panic!("plan {plan:?} compiled to SQL that does not parse: {sql}: {e}")
        });
        assert_eq!(
            parsed.len(),
            1,
            "plan {plan:?} compiled to {} statements: {sql}",
            parsed.len()
        );
    }
});
