//! The kind of a sluice error in gRPC's richer error model: the status
//! details (`grpc-status-details-bin`) are a `google.rpc.Status` whose
//! details hold one `google.rpc.ErrorInfo` with `domain` [`DOMAIN`] and
//! `reason` the kind (`checksum_mismatch`, …) — what any gRPC client's
//! status-details helper decodes. The three messages are declared here
//! with their field numbers from `google/rpc/status.proto` and
//! `google/rpc/error_details.proto`.

use prost::Message;

/// The `ErrorInfo.domain` of sluice's errors.
pub const DOMAIN: &str = "sluice";

/// The type URL of `google.rpc.ErrorInfo` in an `Any`.
const ERROR_INFO: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.ErrorInfo` (its `metadata` map left out: sluice sends none).
#[derive(Clone, PartialEq, Message)]
struct ErrorInfo {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    domain: String,
}

/// The details of a status with `code` and `message` whose kind is `kind`.
pub fn encode(code: tonic::Code, message: &str, kind: &str) -> Vec<u8> {
    let info = ErrorInfo {
        reason: kind.to_string(),
        domain: DOMAIN.to_string(),
    };
    RpcStatus {
        code: code as i32,
        message: message.to_string(),
        details: vec![Any {
            type_url: ERROR_INFO.to_string(),
            value: info.encode_to_vec(),
        }],
    }
    .encode_to_vec()
}

/// The kind in status details that [`encode`] made; `None` for details of
/// any other shape or domain.
pub fn decode(details: &[u8]) -> Option<String> {
    let status = RpcStatus::decode(details).ok()?;
    status
        .details
        .iter()
        .filter(|a| a.type_url == ERROR_INFO)
        .filter_map(|a| ErrorInfo::decode(a.value.as_slice()).ok())
        .find(|i| i.domain == DOMAIN)
        .map(|i| i.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_round_trips_and_other_details_have_none() {
        let bytes = encode(tonic::Code::DataLoss, "torn", "checksum_mismatch");
        assert_eq!(decode(&bytes).as_deref(), Some("checksum_mismatch"));
        // Another domain's ErrorInfo, or bytes that are no Status, say nothing.
        let theirs = RpcStatus {
            code: 5,
            message: "x".into(),
            details: vec![Any {
                type_url: ERROR_INFO.into(),
                value: ErrorInfo {
                    reason: "QUOTA".into(),
                    domain: "example.com".into(),
                }
                .encode_to_vec(),
            }],
        };
        assert_eq!(decode(&theirs.encode_to_vec()), None);
        assert_eq!(decode(b"checksum_mismatch"), None);
        assert_eq!(decode(b""), None);
    }
}
