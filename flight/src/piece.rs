//! [`Piece`]: one stretch of a message body, either bytes that exist (a
//! shared slice of an Arrow buffer, or bytes made for the message) or
//! bytes computed straight into wherever the body is written.
//!
//! A computed piece is how a batch's last elementwise stage runs where its
//! rows are written out ([`crate::finish`]): into a trainer's
//! shared-memory slot it writes its values once, in place, with no buffer
//! of its own between the stage and the slot. A consumer that needs the
//! bytes themselves (a socket) makes them with [`Piece::to_bytes`].

use std::sync::Arc;

use bytes::Bytes;

/// Writes a computed piece's bytes into a buffer of exactly its length.
pub type Fill = Arc<dyn Fn(&mut [u8]) + Send + Sync>;

/// See the module docs.
#[derive(Clone)]
pub enum Piece {
    /// Bytes that exist.
    Bytes(Bytes),
    /// `len` bytes that `fill` writes where they are wanted.
    Computed {
        /// Its length.
        len: usize,
        /// What writes them.
        fill: Fill,
    },
}

impl std::fmt::Debug for Piece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bytes(b) => write!(f, "Bytes({})", b.len()),
            Self::Computed { len, .. } => write!(f, "Computed({len})"),
        }
    }
}

impl From<Bytes> for Piece {
    fn from(b: Bytes) -> Self {
        Self::Bytes(b)
    }
}

impl Piece {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Bytes(b) => b.len(),
            Self::Computed { len, .. } => *len,
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes its bytes into `dst` (of its length).
    pub fn write_to(&self, dst: &mut [u8]) {
        assert_eq!(
            dst.len(),
            self.len(),
            "a piece written to a place of another size"
        );
        match self {
            Self::Bytes(b) => dst.copy_from_slice(b),
            Self::Computed { fill, .. } => fill(dst),
        }
    }

    /// Its bytes: shared when they exist, made (once, here) when computed.
    pub fn to_bytes(&self) -> Bytes {
        match self {
            Self::Bytes(b) => b.clone(),
            Self::Computed { len, fill } => {
                let mut v = vec![0u8; *len];
                fill(&mut v);
                Bytes::from(v)
            }
        }
    }

    /// Its bytes when they exist (not computed).
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            Self::Bytes(b) => Some(b),
            Self::Computed { .. } => None,
        }
    }

    /// Whether it is computed where it is written.
    pub fn is_computed(&self) -> bool {
        matches!(self, Self::Computed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_computed_piece_writes_the_bytes_it_makes() {
        let p = Piece::Computed {
            len: 5,
            fill: Arc::new(|d: &mut [u8]| {
                for (i, b) in d.iter_mut().enumerate() {
                    *b = i as u8 * 3;
                }
            }),
        };
        let mut dst = [9u8; 5];
        p.write_to(&mut dst);
        assert_eq!(dst, [0, 3, 6, 9, 12]);
        assert_eq!(p.to_bytes().as_ref(), &dst);
        assert!(p.is_computed() && !p.is_empty());
        let b = Piece::from(Bytes::from_static(b"abc"));
        let mut dst = [0u8; 3];
        b.write_to(&mut dst);
        assert_eq!(&dst, b"abc");
        assert!(!b.is_computed());
    }

    #[test]
    #[should_panic(expected = "another size")]
    fn a_piece_is_not_written_to_a_place_of_another_size() {
        Piece::from(Bytes::from_static(b"abc")).write_to(&mut [0u8; 2]);
    }
}
