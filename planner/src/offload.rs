//! [`Offload`]: who decides where the stages run.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The offload mode of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Offload {
    /// The cost model picks the cut (or a per-sample split).
    #[default]
    Auto,
    /// Every storage-capable stage runs on storage.
    Storage,
    /// Storage only reads; every stage runs on compute.
    Compute,
    /// A fixed cut: the first N stages run on storage.
    Cut(usize),
}

impl FromStr for Offload {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "storage" => Ok(Self::Storage),
            "compute" => Ok(Self::Compute),
            other => other.parse().map(Self::Cut).map_err(|_| {
                format!("bad offload mode {s:?}: expected auto, storage, compute or a cut index")
            }),
        }
    }
}

impl fmt::Display for Offload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Storage => f.write_str("storage"),
            Self::Compute => f.write_str("compute"),
            Self::Cut(k) => write!(f, "{k}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in ["auto", "storage", "compute", "2"] {
            assert_eq!(m.parse::<Offload>().unwrap().to_string(), m);
        }
        assert!("sideways".parse::<Offload>().is_err());
    }
}
