//! [`Resources`]: the machines a plan runs on, as the cost model sees them.

use serde::{Deserialize, Serialize};

/// Cores on each side and the storage→compute link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    /// Storage nodes holding the dataset.
    pub storage_nodes: usize,
    /// Cores each storage node gives to fragments.
    pub storage_cores: f64,
    /// Cores of the compute node.
    pub compute_cores: f64,
    /// Bytes per second over the storage→compute link, all nodes together;
    /// `None` for a link that is not the bottleneck (in-process).
    pub link_bytes_per_s: Option<f64>,
    /// Where the link figure comes from: "configured", "measured" or "in-process".
    pub link_source: String,
    /// Why the storage and compute sides share one machine, when they do
    /// (the embedded default: storage nodes in the same process; `serve`
    /// with nodes on loopback). Co-located sides are one pool of
    /// `compute_cores` cores and the link is memory: a cut only decides
    /// which thread pool runs a stage, never how many cores work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colocated: Option<String>,
}

/// Cores of this machine.
pub fn machine_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Default for Resources {
    fn default() -> Self {
        let cores = machine_cores() as f64;
        Self {
            storage_nodes: 1,
            storage_cores: cores,
            compute_cores: cores,
            link_bytes_per_s: None,
            link_source: "in-process".into(),
            colocated: Some("every storage node runs on this machine".into()),
        }
    }
}

impl Resources {
    /// The link's rate as text, e.g. `1.00 Gbit/s`.
    pub fn link_text(&self) -> String {
        match self.link_bytes_per_s {
            None => "unlimited".into(),
            Some(b) => format_bits(b),
        }
    }
}

/// Formats bytes per second as bits per second with a unit.
pub fn format_bits(bytes_per_s: f64) -> String {
    let bits = bytes_per_s * 8.0;
    if bits >= 1e9 {
        format!("{:.2} Gbit/s", bits / 1e9)
    } else if bits >= 1e6 {
        format!("{:.1} Mbit/s", bits / 1e6)
    } else {
        format!("{:.0} kbit/s", bits / 1e3)
    }
}

/// Parses a link rate such as `10Gbit`, `1gbps`, `800Mbit/s`, `125MB/s` or
/// `unlimited` into bytes per second (`None` for unlimited).
pub fn parse_rate(text: &str) -> Result<Option<f64>, String> {
    let t = text.trim().to_ascii_lowercase().replace(' ', "");
    if t == "unlimited" || t == "none" || t == "0" {
        return Ok(None);
    }
    let t = t.trim_end_matches("/s");
    let t = match t.strip_suffix("bps") {
        Some(head) => format!("{head}bit"),
        None => t.to_string(),
    };
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("bad link rate {text:?}: expected e.g. 10Gbit, 1Gbit/s or 125MB/s"))?;
    let (scale, bits) = match unit {
        "" | "b" => (1.0, false),
        "bit" => (1.0, true),
        "k" | "kb" | "kib" => (1e3, unit == "k"),
        "kbit" => (1e3, true),
        "m" | "mb" | "mib" => (1e6, unit == "m"),
        "mbit" => (1e6, true),
        "g" | "gb" | "gib" => (1e9, unit == "g"),
        "gbit" => (1e9, true),
        _ => {
            return Err(format!(
                "bad link rate {text:?}: unknown unit {unit:?} (use bit, kbit, Mbit, Gbit or B, kB, MB, GB)"
            ));
        }
    };
    let bytes = value * scale / if bits { 8.0 } else { 1.0 };
    if bytes <= 0.0 || !bytes.is_finite() {
        return Err(format!("bad link rate {text:?}: must be positive"));
    }
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("10Gbit").unwrap(), Some(1.25e9));
        assert_eq!(parse_rate("1 Gbit/s").unwrap(), Some(1.25e8));
        assert_eq!(parse_rate("1gbps").unwrap(), Some(1.25e8));
        assert_eq!(parse_rate("125MB/s").unwrap(), Some(1.25e8));
        assert_eq!(parse_rate("unlimited").unwrap(), None);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("10 furlongs").is_err());
        assert_eq!(format_bits(1.25e8), "1.00 Gbit/s");
    }
}
