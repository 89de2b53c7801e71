//! Byte sizes on the command line: `512`, `64KiB`, `4MiB`, `16GiB`, `1G`.

/// Parses a size with an optional binary (KiB, MiB, GiB, TiB) or decimal
/// (K, M, G, T, KB …) suffix.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size '{s}'"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" | "kb" => 1 << 10,
        "mib" | "m" | "mb" => 1 << 20,
        "gib" | "g" | "gb" => 1 << 30,
        "tib" | "t" | "tb" => 1 << 40,
        other => return Err(format!("invalid size unit '{other}' in '{s}'")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size '{s}' overflows"))
}

/// Formats bytes with a binary unit.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_size("16G").unwrap(), 16 << 30);
        assert!(parse_size("3 parsecs").is_err());
        assert!(parse_size("99999999999TiB").is_err());
        assert_eq!(human(1536), "1.5 KiB");
    }
}
