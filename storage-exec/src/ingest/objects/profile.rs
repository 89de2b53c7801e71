//! The AWS shared profile files, for S3 credentials that are not in the
//! environment.
//!
//! `object_store` takes S3 credentials from the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`),
//! from a web identity token, from ECS's container endpoint or from EC2's
//! instance metadata, but not from the profile files the AWS CLI writes.
//! This reads them the way the CLI does: the profile named by
//! `AWS_PROFILE` (else `default`) of `AWS_SHARED_CREDENTIALS_FILE` (else
//! `~/.aws/credentials`) for the keys, and of `AWS_CONFIG_FILE` (else
//! `~/.aws/config`, sections `[profile NAME]`) for `region` and
//! `endpoint_url`. Nothing read here is logged or put in an error.

use std::collections::HashMap;
use std::path::PathBuf;

/// What a profile gives, each only where the file has it.
#[derive(Default)]
pub(super) struct Profile {
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
}

impl std::fmt::Debug for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        f.debug_struct("Profile")
            .field("has_keys", &self.access_key_id.is_some())
            .field("region", &self.region)
            .field("endpoint_url", &self.endpoint_url)
            .finish()
    }
}

impl Profile {
    /// The profile the environment names, from its files (missing files
    /// give an empty profile).
    pub(super) fn from_files() -> Self {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let file = |var: &str, default: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(default)))
        };
        let name = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
        let read = |p: Option<PathBuf>| p.and_then(|p| std::fs::read_to_string(p).ok());
        let credentials = read(file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"));
        let config = read(file("AWS_CONFIG_FILE", ".aws/config"));
        Self::parse(
            credentials.as_deref().unwrap_or(""),
            config.as_deref().unwrap_or(""),
            &name,
        )
    }

    fn parse(credentials: &str, config: &str, name: &str) -> Self {
        let mut keys = section(credentials, name);
        let config_name = if name == "default" {
            "default".to_owned()
        } else {
            format!("profile {name}")
        };
        let mut conf = section(config, &config_name);
        Self {
            access_key_id: keys.remove("aws_access_key_id"),
            secret_access_key: keys.remove("aws_secret_access_key"),
            session_token: keys.remove("aws_session_token"),
            region: conf.remove("region"),
            endpoint_url: conf.remove("endpoint_url"),
        }
    }
}

/// The `key = value` lines of section `[name]` of an INI text.
fn section(text: &str, name: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = header.trim() == name;
            continue;
        }
        if inside && let Some((k, v)) = line.split_once('=') {
            out.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_named_profile_is_read_from_both_files() {
        let credentials = "[default]\naws_access_key_id = A\naws_secret_access_key = B\n\
                           [work]\naws_access_key_id=WA\naws_secret_access_key=WB\n\
                           aws_session_token = WT\n";
        let config = "[default]\nregion = eu-west-1\n[profile work]\nregion = us-east-2\n\
                      endpoint_url = http://127.0.0.1:9000\n";
        let p = Profile::parse(credentials, config, "work");
        assert_eq!(p.access_key_id.as_deref(), Some("WA"));
        assert_eq!(p.secret_access_key.as_deref(), Some("WB"));
        assert_eq!(p.session_token.as_deref(), Some("WT"));
        assert_eq!(p.region.as_deref(), Some("us-east-2"));
        assert_eq!(p.endpoint_url.as_deref(), Some("http://127.0.0.1:9000"));
        let d = Profile::parse(credentials, config, "default");
        assert_eq!(d.access_key_id.as_deref(), Some("A"));
        assert_eq!(d.region.as_deref(), Some("eu-west-1"));
        assert!(d.session_token.is_none());
        assert!(!format!("{p:?}").contains("WB"));
    }
}
