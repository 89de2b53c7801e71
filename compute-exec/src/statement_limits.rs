//! [`check_statement_size`]: how big a SQL statement may be before it is
//! planned.
//!
//! DataFusion's planner, optimizer and even the drop of an expression tree
//! recurse over expressions. A statement such as `SELECT 1+1+…+1` with a few
//! thousand terms parses in a loop (sqlparser's recursion limit never sees
//! it) and then overflows the stack of whatever thread plans it — a query
//! worker, or the main thread restoring a saved job — and 5,000 `AND`s take
//! a minute to optimize. Every statement is therefore measured on its
//! tokens, which the tokenizer produces without recursion, before the
//! parser builds a tree: the number of tokens, the operators (each one a
//! level in a left-deep expression tree), and how deeply parentheses and
//! `CASE … END` nest. A statement over a limit is a planning error (a 400
//! over REST, INVALID_ARGUMENT over Flight) that says which limit and how
//! to stay under it. The limits are far above any preprocessing pipeline:
//! a pipeline is a few UDF calls and a filter.

use datafusion::common::{Result, plan_err};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

/// Most tokens a statement may have.
pub const MAX_TOKENS: usize = 20_000;
/// Most binary and logical operators in a statement.
pub const MAX_OPERATORS: usize = 500;
/// Deepest nesting of parentheses and `CASE … END`.
pub const MAX_NESTING: usize = 64;

/// Refuses `sql` when it is over one of the limits above; tokenizer
/// errors are left to the parser, which words them better.
pub fn check_statement_size(sql: &str) -> Result<()> {
    let dialect = GenericDialect {};
    let Ok(tokens) = Tokenizer::new(&dialect, sql).tokenize() else {
        return Ok(());
    };
    let mut count = 0usize;
    let mut operators = 0usize;
    let (mut depth, mut deepest) = (0usize, 0usize);
    for token in &tokens {
        match token {
            Token::Whitespace(_) => continue,
            Token::LParen => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            Token::Word(w) if w.keyword == Keyword::CASE => depth += 1,
            Token::Word(w) if w.keyword == Keyword::END => depth = depth.saturating_sub(1),
            Token::Word(w) if matches!(w.keyword, Keyword::AND | Keyword::OR) => operators += 1,
            Token::Plus
            | Token::Minus
            | Token::Mul
            | Token::Div
            | Token::Mod
            | Token::DuckIntDiv
            | Token::StringConcat
            | Token::Eq
            | Token::DoubleEq
            | Token::Neq
            | Token::Lt
            | Token::Gt
            | Token::LtEq
            | Token::GtEq
            | Token::Spaceship
            | Token::Caret
            | Token::Ampersand
            | Token::Pipe
            | Token::ShiftLeft
            | Token::ShiftRight => operators += 1,
            _ => {}
        }
        count += 1;
        deepest = deepest.max(depth);
    }
    if count > MAX_TOKENS {
        return plan_err!(
            "the statement has {count} tokens, over the limit of {MAX_TOKENS}: \
             a pipeline is a few function calls and a filter"
        );
    }
    if operators > MAX_OPERATORS {
        return plan_err!(
            "the statement has {operators} operators, over the limit of {MAX_OPERATORS} \
             (each is a level of the expression tree the planner recurses over); \
             for many alternatives use `IN (…)`"
        );
    }
    if deepest > MAX_NESTING {
        return plan_err!(
            "parentheses or CASE expressions nest {deepest} deep, over the limit of {MAX_NESTING}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(op: &str, n: usize) -> String {
        let terms: Vec<String> = (0..n).map(|i| format!("x{i}")).collect();
        format!("SELECT {} FROM t", terms.join(op))
    }

    #[test]
    fn ordinary_pipelines_pass() {
        check_statement_size(
            "SELECT key, normalize(random_resized_crop(decode_image(data), 224, 224), \
             [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) FROM pets \
             WHERE split = 'train' AND label IN (1, 2, 3) OR width > 3 * height",
        )
        .unwrap();
        check_statement_size(&chain(" + ", MAX_OPERATORS + 1)).unwrap();
    }

    #[test]
    fn long_chains_deep_nesting_and_huge_statements_are_refused() {
        let err = check_statement_size(&chain(" + ", MAX_OPERATORS + 2)).unwrap_err();
        assert!(
            err.to_string().contains("operators, over the limit"),
            "{err}"
        );
        let err = check_statement_size(&chain(" AND ", 5_000)).unwrap_err();
        assert!(err.to_string().contains("IN (…)"), "{err}");
        let nested = format!("SELECT {}1{} FROM t", "(".repeat(100), ")".repeat(100));
        let err = check_statement_size(&nested).unwrap_err();
        assert!(err.to_string().contains("nest 100 deep"), "{err}");
        let cases = format!(
            "SELECT {} 1 {} FROM t",
            "CASE WHEN a THEN ".repeat(70),
            "END ".repeat(70)
        );
        assert!(check_statement_size(&cases).is_err());
        let wide = format!("SELECT {} FROM t", vec!["1"; 15_000].join(", "));
        let err = check_statement_size(&wide).unwrap_err();
        assert!(err.to_string().contains("tokens, over the limit"), "{err}");
    }
}
