//! sluice's SQL is read-only: a statement that would change something is
//! refused by its first keyword, naming it, before it is planned (whose
//! errors would speak of values lists and memory tables); datasets change
//! by ingest.

use tonic::{Code, Status};

/// Statements that change something, by their first keyword.
const WRITES: [&str; 12] = [
    "INSERT", "UPDATE", "DELETE", "MERGE", "CREATE", "DROP", "ALTER", "TRUNCATE", "COPY", "SET",
    "RESET", "GRANT",
];

/// The kind of a refused write.
const KIND: &str = "read_only";

/// Refuses `sql` if it would change something.
pub fn refuse_writes(sql: &str) -> Result<(), Status> {
    let first = sql
        .trim_start_matches(|c: char| c.is_whitespace() || c == '(')
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("")
        .to_ascii_uppercase();
    if WRITES.contains(&first.as_str()) {
        return Err(sluice_base::fault::status_with(
            Code::InvalidArgument,
            KIND,
            &format!(
                "{first} refused: sluice's SQL is read-only (DDL, DML, COPY and SET are \
                 refused; datasets change by ingest)"
            ),
        ));
    }
    Ok(())
}

/// The answer to an update command.
pub fn refused_update() -> Status {
    sluice_base::fault::status_with(
        Code::InvalidArgument,
        KIND,
        "sluice's SQL is read-only: DDL, DML, COPY and SET are refused (datasets change by \
         ingest)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_refused_by_their_first_word() {
        for sql in [
            "insert into t values (1)",
            "  CREATE TABLE x (a int)",
            "SET a = 1",
            "copy t to 'f'",
        ] {
            let e = refuse_writes(sql).unwrap_err();
            assert!(e.message().contains("read-only"), "{sql}: {e}");
            assert_eq!(sluice_base::fault::kind_of(&e).0.as_deref(), Some(KIND));
        }
        for sql in [
            "SELECT 1",
            "(SELECT 1)",
            "with a as (select 1) select * from a",
            "EXPLAIN SELECT 1",
        ] {
            assert!(refuse_writes(sql).is_ok(), "{sql}");
        }
    }
}
