//! A sample's holders, as a window reads them: the pins it must avoid
//! ([`Avoid`]: nodes lost, or a replica found corrupt), the samples left
//! with no holder ([`Unheld`]), and which live holder reads a sample
//! ([`spread`]). `SampleIndex::takes` uses all three.

/// The most nodes a job's dataset may be spread over.
pub const MAX_HOLDERS: usize = u8::MAX as usize + 1;

/// Pins (by index) a window must not read from: a set of at most
/// [`MAX_HOLDERS`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Avoid([u64; MAX_HOLDERS / 64]);

impl Avoid {
    /// Adds pin `pin`.
    pub fn insert(&mut self, pin: u8) {
        self.0[usize::from(pin) / 64] |= 1 << (pin % 64);
    }

    /// Whether pin `pin` is in.
    pub fn contains(&self, pin: u8) -> bool {
        self.0[usize::from(pin) / 64] & (1 << (pin % 64)) != 0
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// Adds every pin of `other`.
    pub fn extend(&mut self, other: &Avoid) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a |= b;
        }
    }
}

/// Samples of a window none of whose holders may be read: the nodes
/// holding them, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unheld {
    /// How many of the window's samples.
    pub samples: usize,
    /// Their holders.
    pub nodes: Vec<String>,
}

/// Which of `k` live holders reads sample `s`: a multiplicative hash of
/// `s`, so that the choice does not follow the way samples were dealt
/// to parts (by position mod the node count) and each holder takes about
/// `1/k` of any window's reads.
pub fn spread(s: u64, k: usize) -> usize {
    let h = s.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    (h % k.max(1) as u64) as usize
}
