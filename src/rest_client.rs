//! A small client of the REST API for the CLI's `job` commands and a
//! compute node's calls to its coordinator: one
//! HTTP/1.1 request per call over hyper's connection API, over TLS for an
//! `https://` URL (the server checked against the cluster's CA,
//! `--tls-ca`), the bearer token when there is one, and the server's
//! `{code, message}` errors as one line.

use std::sync::Arc;

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use sluice_flight::Tls;
use tokio::net::TcpStream;

/// Where the REST API is, and the token it wants.
#[derive(Debug, Clone)]
pub struct RestClient {
    authority: String,
    token: Option<String>,
    /// The TLS of an `https://` URL.
    tls: Option<Arc<Tls>>,
}

impl RestClient {
    /// A client of `url` (`http://host:port`, or `https://host:port` with
    /// `tls` holding the CA the server is checked against).
    pub fn new(url: &str, token: Option<String>, tls: Option<Arc<Tls>>) -> anyhow::Result<Self> {
        let (rest, tls) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (rest, None),
            (None, Some(rest)) => match tls {
                Some(t) if t.trusts() => (rest, Some(t)),
                _ => bail!("{url}: an https:// URL needs the cluster's CA (--tls-ca)"),
            },
            (None, None) => bail!("{url}: expected http://HOST:PORT or https://HOST:PORT"),
        };
        let authority = rest.trim_end_matches('/').to_string();
        if authority.is_empty() || authority.contains('/') {
            bail!("{url}: expected http(s)://HOST:PORT");
        }
        Ok(Self {
            authority,
            token,
            tls,
        })
    }

    /// The URL it calls.
    fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.authority)
    }

    /// `method path` with an optional JSON body; the JSON answer, or an
    /// error that says what the server said.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let (status, value) = self.send(method, path, body).await?;
        if status.is_success() {
            return Ok(value);
        }
        Err(refusal(status, &value))
    }

    /// `GET path`: the JSON answer, `None` if the server says 404.
    pub async fn get_optional(&self, path: &str) -> anyhow::Result<Option<Value>> {
        match self.send(Method::GET, path, None).await? {
            (StatusCode::NOT_FOUND, _) => Ok(None),
            (status, value) if status.is_success() => Ok(Some(value)),
            (status, value) => Err(refusal(status, &value)),
        }
    }

    /// One request: the status and the JSON (or text) answer.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let mut sender = match &self.tls {
            Some(tls) => {
                let stream = tls
                    .connect(&self.authority)
                    .await
                    .map_err(|e| anyhow::anyhow!("the sluice server at {}: {e}", self.url()))?;
                self.handshake(stream).await?
            }
            None => {
                let stream = TcpStream::connect(&self.authority)
                    .await
                    .with_context(|| format!("cannot reach the sluice server at {}", self.url()))?;
                self.handshake(stream).await?
            }
        };
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(http::header::HOST, &self.authority);
        if let Some(t) = &self.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let payload = match body {
            Some(v) => {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(v)?)
            }
            None => Bytes::new(),
        };
        let resp = sender
            .send_request(req.body(Full::new(payload))?)
            .await
            .with_context(|| format!("{method} {path}: the server closed the connection"))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let value: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).trim().to_string()));
        Ok((status, value))
    }
}

impl RestClient {
    /// HTTP/1.1 over `io`, its connection driven on a task of its own.
    async fn handshake<I>(&self, io: I) -> anyhow::Result<SendRequest<Full<Bytes>>>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .with_context(|| format!("{}: not an HTTP server", self.url()))?;
        sluice_base::task::detach(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }
}

/// The error of a refused request: what the server said, on one line.
fn refusal(status: StatusCode, value: &Value) -> anyhow::Error {
    let said = match (&value["code"], &value["message"]) {
        (Value::String(c), Value::String(m)) => format!("{c}: {m}"),
        _ => value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_string),
    };
    if status == StatusCode::UNAUTHORIZED {
        return anyhow::anyhow!("{said} (set SLUICE_TOKEN or --token)");
    }
    anyhow::anyhow!("{said}")
}
