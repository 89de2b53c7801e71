//! [`OnError`]: what a stage does with one sample it cannot take: an
//! object an ingest cannot read or probe, a sample a UDF cannot decode.
//! One policy for both, named the same on every surface (the CLI's
//! `--on-error`, REST bodies, SQL headers, a job's spec).

use std::fmt;
use std::str::FromStr;

/// What to do with a sample that cannot be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Leave it out, count it and name it (a query drops the row; an
    /// ingest leaves the object out of the version, in its report).
    Skip,
    /// Keep the row with a NULL result, count it and name it (a query's
    /// only: an ingest has no row to keep).
    Null,
    /// Fail with an error naming the sample and the reason (a query
    /// fails; an ingest commits nothing). A query's default; an ingest's
    /// is [`OnError::Skip`].
    #[default]
    Fail,
}

impl OnError {
    /// This policy for an ingest, or why it is not one: an ingest skips
    /// or fails an object, and has no row to keep with a NULL.
    pub fn for_ingest(self) -> Result<Self, String> {
        match self {
            Self::Null => Err(
                "error policy 'null' keeps a row with a NULL result, which only a query has; \
                 an ingest skips or fails an object (expected skip or fail)"
                    .into(),
            ),
            other => Ok(other),
        }
    }

    /// Parses an ingest's policy: `skip` or `fail`.
    pub fn parse_ingest(s: &str) -> Result<Self, String> {
        s.parse::<Self>()?.for_ingest()
    }
}

impl FromStr for OnError {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "skip" => Ok(Self::Skip),
            "null" => Ok(Self::Null),
            "fail" => Ok(Self::Fail),
            other => Err(format!(
                "unknown error policy '{other}' (expected skip, null or fail)"
            )),
        }
    }
}

impl fmt::Display for OnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Skip => "skip",
            Self::Null => "null",
            Self::Fail => "fail",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_parses_back_from_its_name() {
        for p in [OnError::Skip, OnError::Null, OnError::Fail] {
            assert_eq!(p.to_string().parse::<OnError>(), Ok(p));
        }
        let err = "drop".parse::<OnError>().unwrap_err();
        assert!(
            err.contains("'drop'") && err.contains("skip, null or fail"),
            "{err}"
        );
    }

    #[test]
    fn an_ingest_takes_skip_and_fail_and_refuses_null_by_name() {
        assert_eq!(OnError::parse_ingest("skip"), Ok(OnError::Skip));
        assert_eq!(OnError::parse_ingest("fail"), Ok(OnError::Fail));
        let err = OnError::parse_ingest("null").unwrap_err();
        assert!(
            err.contains("'null'") && err.contains("skip or fail"),
            "{err}"
        );
        assert!(OnError::parse_ingest("nope").is_err());
    }
}
