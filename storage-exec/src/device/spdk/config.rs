//! The bdev config, read before SPDK sees it: its shape checked (SPDK
//! reports a file that is not JSON, or one without a `subsystems` list,
//! only as "Invalid argument"), and whether it needs the PCI bus.

/// The config's JSON, checked for the shape SPDK reads.
pub(super) fn parse_config(json: &[u8]) -> std::result::Result<serde_json::Value, String> {
    const SHAPE: &str =
        r#"{"subsystems": [{"subsystem": "bdev", "config": [{"method": ..., "params": {...}}]}]}"#;
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("not a JSON bdev config: {e}"))?;
    let subsystems = value
        .get("subsystems")
        .and_then(|s| s.as_array())
        .ok_or_else(|| {
            format!("the bdev config has no \"subsystems\" list; SPDK expects {SHAPE}")
        })?;
    for (i, s) in subsystems.iter().enumerate() {
        if s.get("subsystem").and_then(|n| n.as_str()).is_none() {
            return Err(format!(
                "subsystems[{i}] names no \"subsystem\"; SPDK expects {SHAPE}"
            ));
        }
    }
    Ok(value)
}

/// Whether the config attaches NVMe controllers over PCIe, so the
/// environment must scan the PCI bus; file and malloc bdevs need no scan
/// (and no access to /sys/bus/pci or vfio).
pub(super) fn wants_pci(value: &serde_json::Value) -> bool {
    let subsystems = value.get("subsystems").and_then(|s| s.as_array());
    subsystems.into_iter().flatten().any(|s| {
        s.get("config")
            .and_then(|c| c.as_array())
            .into_iter()
            .flatten()
            .any(|m| {
                m.get("method").and_then(|m| m.as_str()) == Some("bdev_nvme_attach_controller")
                    && m.get("params")
                        .and_then(|p| p.get("trtype"))
                        .and_then(|t| t.as_str())
                        .is_some_and(|t| t.eq_ignore_ascii_case("pcie"))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_that_spdk_would_only_call_invalid_are_named() {
        let err = parse_config(b"subsystems: [").unwrap_err();
        assert!(err.starts_with("not a JSON bdev config"), "{err}");
        let err = parse_config(br#"{"bdev": []}"#).unwrap_err();
        assert!(err.contains("no \"subsystems\" list"), "{err}");
        let err = parse_config(br#"{"subsystems": [{"config": []}]}"#).unwrap_err();
        assert!(err.contains("subsystems[0]"), "{err}");
        let ok = parse_config(br#"{"subsystems": [{"subsystem": "bdev", "config": []}]}"#);
        assert!(ok.is_ok());
    }

    #[test]
    fn only_a_pcie_controller_asks_for_the_pci_bus() {
        let config = |method: &str, params: &str| {
            parse_config(
                format!(
                    r#"{{"subsystems": [{{"subsystem": "bdev", "config": [{{"method": "{method}", "params": {params}}}]}}]}}"#
                )
                .as_bytes(),
            )
            .unwrap()
        };
        assert!(wants_pci(&config(
            "bdev_nvme_attach_controller",
            r#"{"name": "Nvme0", "trtype": "PCIe", "traddr": "0000:5e:00.0"}"#
        )));
        assert!(!wants_pci(&config(
            "bdev_nvme_attach_controller",
            r#"{"name": "Nvme0", "trtype": "TCP", "traddr": "192.0.2.1"}"#
        )));
        assert!(!wants_pci(&config(
            "bdev_aio_create",
            r#"{"name": "aio0", "filename": "/x"}"#
        )));
    }
}
