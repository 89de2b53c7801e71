//! A node's location as a registration gives it, checked before anything
//! is dialled: a `grpc://`, `grpc+tcp://`, `grpc+tls://`, `http://` or
//! `https://` address of a host and a port, nothing else, and no address
//! that no node can have (see [`well_formed`]).

use std::net::IpAddr;

use super::error::{ApiError, Kind};

/// A node's location, if it is one: `grpc://`, `grpc+tcp://`,
/// `grpc+tls://`, `http://` or `https://`, a host and a port in
/// 1..=65535, nothing else (no user or password, path or query), at most
/// 256 bytes, and not an address no
/// node can have (unspecified, link-local — where clouds serve their
/// metadata —, multicast or broadcast).
pub fn well_formed(location: &str) -> Result<(), ApiError> {
    location_error(location).map_or(Ok(()), |why| {
        Err(ApiError::new(
            Kind::InvalidLocation,
            format!(
                "location {:?}: {why}; expected grpc://HOST:PORT",
                location.chars().take(64).collect::<String>()
            ),
        ))
    })
}

/// What is wrong with `location` as a node's (see [`well_formed`]).
fn location_error(location: &str) -> Option<String> {
    if location.len() > 256
        || location
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Some("over 256 bytes, or with whitespace".into());
    }
    let Some((scheme, rest)) = location.split_once("://") else {
        return Some("no scheme".into());
    };
    if !matches!(scheme, "grpc" | "grpc+tcp" | "grpc+tls" | "http" | "https") {
        return Some(format!(
            "scheme {scheme:?} is not grpc, grpc+tcp, grpc+tls, http or https"
        ));
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        return Some("a path, query or fragment".into());
    }
    if authority.contains('@') {
        return Some("a user or password".into());
    }
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once("]:") {
            Some((h, p)) => (h, p),
            None => return Some("no port".into()),
        },
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, p),
            None => return Some("no port".into()),
        },
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => {}
        _ => return Some(format!("port {port:?} is not in 1..=65535")),
    }
    if host.is_empty() {
        return Some("no host".into());
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        let unusable = ip.is_unspecified()
            || ip.is_multicast()
            || match ip {
                IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast(),
                IpAddr::V6(v6) => v6.is_unicast_link_local(),
            };
        if unusable {
            return Some(format!("{ip} is not a node's address"));
        }
    } else if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    {
        return Some(format!("host {host:?} is not a name or an address"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_is_a_host_and_a_port_and_nothing_else() {
        for ok in [
            "grpc://10.0.0.7:50052",
            "grpc+tcp://node-3.example:1",
            "http://127.0.0.1:65535/",
            "grpc://[::1]:7",
            "grpc+tls://node-3.example:443",
            "https://10.0.0.7:50051",
        ] {
            assert_eq!(location_error(ok), None, "{ok}");
        }
        for (bad, needle) in [
            ("http://user:pw@169.254.169.254/latest", "path"),
            ("http://user:pw@10.0.0.1:80", "user or password"),
            ("grpc://x:99999999", "port"),
            ("grpc://x:0", "port"),
            ("grpc://x", "no port"),
            ("grpc://169.254.169.254:80", "not a node's address"),
            ("grpc://0.0.0.0:80", "not a node's address"),
            ("grpc://[fe80::1]:80", "not a node's address"),
            ("grpc://:80", "no host"),
            ("ftp://x:1", "scheme"),
            ("x:1", "no scheme"),
            ("grpc://x y:1", "whitespace"),
            ("grpc://a_b:1", "not a name"),
        ] {
            let e = location_error(bad).unwrap_or_else(|| panic!("{bad} passed"));
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}
