//! [`Piece`]: one stretch of a message body, either bytes that exist (a
//! shared slice of an Arrow buffer, or bytes made for the message) or
//! bytes computed straight into wherever the body is written.
//!
//! A computed piece is how a batch's last elementwise stage runs where its
//! rows are written out ([`crate::finish`]): into a trainer's
//! shared-memory slot it writes its values once, in place, with no buffer
//! of its own between the stage and the slot. A consumer that needs the
//! bytes themselves (a socket) makes them with [`Piece::to_bytes`].

use bytes::Bytes;

use crate::finish::Finished;

/// See the module docs.
#[derive(Clone)]
pub enum Piece {
    /// Bytes that exist.
    Bytes(Bytes),
    /// Bytes a finish stage makes where they are wanted.
    Computed(Finished),
}

impl std::fmt::Debug for Piece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bytes(b) => write!(f, "Bytes({})", b.len()),
            Self::Computed(c) => write!(f, "Computed({}, {})", c.stage().describe("…"), c.len()),
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
            Self::Computed(c) => c.len(),
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
            Self::Computed(c) => c.write(dst),
        }
    }

    /// Its bytes: shared when they exist, made (once, here) when computed.
    pub fn to_bytes(&self) -> Bytes {
        match self {
            Self::Bytes(b) => b.clone(),
            Self::Computed(c) => {
                let mut v = vec![0u8; c.len()];
                c.write(&mut v);
                Bytes::from(v)
            }
        }
    }

    /// Its bytes when they exist (not computed).
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            Self::Bytes(b) => Some(b),
            Self::Computed(_) => None,
        }
    }

    /// Whether it is computed where it is written.
    pub fn is_computed(&self) -> bool {
        matches!(self, Self::Computed(_))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, UInt8Array};

    use super::*;
    use crate::finish::Finish;

    /// Each value times three.
    #[derive(Debug)]
    pub(crate) struct Triple;

    impl Finish for Triple {
        fn row_bytes(&self) -> usize {
            1
        }

        fn write(&self, source: &ArrayRef, start: usize, len: usize, out: &mut [u8]) {
            let v = source.as_any().downcast_ref::<UInt8Array>().unwrap();
            for (i, o) in out.iter_mut().enumerate().take(len) {
                *o = v.value(start + i) * 3;
            }
        }

        fn describe(&self, input: &str) -> String {
            format!("triple({input})")
        }
    }

    #[test]
    fn a_computed_piece_writes_the_bytes_it_makes() {
        let column: ArrayRef = Arc::new(UInt8Array::from(vec![9, 0, 1, 2, 3, 4]));
        let p = Piece::Computed(Finished::new(
            Arc::new(Triple),
            vec![column],
            vec![(0, 1, 5)],
        ));
        assert_eq!(format!("{p:?}"), "Computed(triple(…), 5)");
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
