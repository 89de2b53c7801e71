//! [`Link`]: the Flight channel to one storage node, under the node's
//! name, and its errors as [`LinkError`]s that name the node. What a
//! storage node's client and its feeds share.

use arrow_flight::error::FlightError;

use crate::credential::{Credential, FlightClient};
use crate::error::LinkError;
use crate::stream::connect;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Link {
    /// The node's name: the URL it is dialled at.
    pub node: String,
    /// The Flight client, connected on first use.
    pub inner: FlightClient,
    /// The connection under it.
    pub channel: tonic::transport::Channel,
}

impl Link {
    /// The link to the node at `url`, presenting `credential`.
    pub fn connect(url: &str, credential: Credential) -> Result<Self, LinkError> {
        let (node, inner, channel) = connect(url, credential).map_err(LinkError::Protocol)?;
        Ok(Self {
            node,
            inner,
            channel,
        })
    }

    /// A status the node answered, as an error naming it.
    pub fn status(&self, s: &tonic::Status) -> LinkError {
        LinkError::from_status(&self.node, s)
    }

    /// An error of a Flight stream from the node, naming it.
    pub fn flight(&self, e: FlightError) -> LinkError {
        match e {
            FlightError::Tonic(s) => self.status(&s),
            other => LinkError::internal(&self.node, other.to_string()),
        }
    }
}
