//! Shared-memory delivery to a trainer on the same host.
//!
//! A trainer that reads a job over loopback gRPC pays for a network hop it
//! does not need: the server's socket copy, HTTP/2 framing, the kernel's
//! copy into the client and the client's IPC read, all on the cores that
//! decode. When the trainer proves it shares the server's `/dev/shm` (a
//! `Probe`: a file it made there holding a nonce the server reads back),
//! the job's stream becomes control messages only and the batches travel
//! through a [`Segment`]:
//!
//! ```text
//!   /dev/shm/sluice-seg-<pid>-<n>   (unlinked once the trainer has mapped it)
//!   +------------------------------+  0
//!   | magic, slots, slot_bytes     |
//!   | mapped flag (trainer sets)   |  MAPPED_AT
//!   | retired flag (server sets)   |  RETIRED_AT: dropped, let go of it
//!   | slot states, 1 byte each     |  STATES_AT: FREE 0 / USED 1
//!   +------------------------------+  HEADER (4096)
//!   | slot 0: one IPC message      |  an encapsulated Arrow record batch
//!   | slot 1                       |
//!   | ...                          |
//!   +------------------------------+
//! ```
//!
//! The server marks a free slot USED, writes the batch's encapsulated IPC
//! message into it — the one copy of its bytes on this path, straight from
//! the arrays' buffers (`sluice_flight::gather::encode_batch`) — and sends the slot's number in
//! the batch's app metadata. The trainer builds Arrow arrays over its
//! mapping (no copy) and marks the slot FREE when the last of them is
//! garbage. A trainer that holds every slot does not make the server wait
//! for ever or grow: after [`SLOT_WAIT`] the batch goes over Flight as
//! usual (gRPC's flow control is then the backpressure). The segment is a
//! fixed size, unlinked once the trainer mapped it (a stream that ends
//! first waits for that, [`MAP_WAIT`] at most), and unmapped when the
//! stream ends — or, when the stream was read to its end, kept for the
//! trainer's next stream ([`crate::kept`]);
//! files a killed server left are removed by the next one to make a
//! segment or region ([`crate::host::sweep`], once per process), and so are probes of trainers
//! killed before their server answered.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sluice_flight::shm_handshake::{SEGMENT_PREFIX, SHM_DIR, SegmentInfo, SlotRef};
use sluice_flight::slices::SlicedMessage;

/// Bytes before the first slot.
pub const HEADER: usize = 4096;
/// Offset of the flag the trainer sets once it has mapped the segment.
pub const MAPPED_AT: usize = 32;
/// Where the server marks a segment it dropped: the trainer may let go
/// of its mapping (see [`crate::kept`]).
pub const RETIRED_AT: usize = 33;
/// Offset of the slots' state bytes.
pub const STATES_AT: usize = 64;
/// A slot the server may write.
pub const FREE: u8 = 0;
/// A slot the trainer holds.
pub const USED: u8 = 1;
/// The segment's first 8 bytes.
pub const MAGIC: &[u8; 8] = b"SLUICE01";
/// Most slots of a segment.
pub const MAX_SLOTS: usize = 6;
/// Fewest slots worth a segment.
pub const MIN_SLOTS: usize = 2;
/// Most bytes of one segment.
pub const SEGMENT_BUDGET: usize = 256 << 20;
/// How long a batch waits for a free slot before it goes over Flight.
pub const SLOT_WAIT: Duration = Duration::from_millis(50);

/// How long the end of a stream waits for the trainer to map its segment.
pub const MAP_WAIT: Duration = Duration::from_secs(10);

/// Bytes of every segment this process has mapped now.
static MAPPED_BYTES: AtomicU64 = AtomicU64::new(0);
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Bytes of shared memory this process's open segments map.
pub fn mapped_bytes() -> u64 {
    MAPPED_BYTES.load(Ordering::Relaxed)
}

/// A mapped segment of one stream. Shared (`Arc`) so that its slots are
/// written on the blocking pool, not on the runtime serving the stream.
#[derive(Debug)]
pub struct Segment {
    path: PathBuf,
    base: *mut u8,
    size: usize,
    slots: usize,
    slot_bytes: usize,
    linked: AtomicBool,
    next: AtomicUsize,
}

// SAFETY: the mapping is owned by the `Segment` alone (no references into
// it outlive a call); the pointer is valid on any thread until `drop`
// unmaps it.
unsafe impl Send for Segment {}
// SAFETY: shared access touches the header only through atomics, and a
// slot's bytes only after winning that slot's FREE -> USED exchange, which
// no other writer can win until the trainer frees it.
unsafe impl Sync for Segment {}

/// The encapsulated IPC message's length: continuation, metadata length,
/// the flatbuffer padded to 8, the body.
pub fn message_len(m: &SlicedMessage) -> usize {
    8 + m.header.len().next_multiple_of(8) + m.body_len()
}

impl Segment {
    /// A segment whose slots fit `first` (the stream's first batch) with
    /// room to spare, or `None` when such batches are too big to be worth
    /// it.
    pub fn for_batch(first: usize) -> std::io::Result<Option<Self>> {
        let slot_bytes = Self::slot_bytes_for(first);
        let slots = (SEGMENT_BUDGET / slot_bytes).min(MAX_SLOTS);
        if slots < MIN_SLOTS {
            return Ok(None);
        }
        Self::create(slots, slot_bytes).map(Some)
    }

    /// The slot size [`Segment::for_batch`] gives batches like `first`.
    pub fn slot_bytes_for(first: usize) -> usize {
        (first + first / 4 + (64 << 10)).next_multiple_of(4096)
    }

    /// A new segment of `slots` slots of `slot_bytes`.
    pub fn create(slots: usize, slot_bytes: usize) -> std::io::Result<Self> {
        assert!(slots > 0 && slots <= HEADER - STATES_AT && slot_bytes.is_multiple_of(4096));
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // Unique per process and stream; `create_new` refuses a file
        // someone else made under the name.
        let name = format!("{SEGMENT_PREFIX}{}-{n}", std::process::id());
        let path = Path::new(SHM_DIR).join(name);
        let size = HEADER + slots * slot_bytes;
        // Only the server's user may map it: a trainer of another user
        // cannot open it and reads over Flight instead.
        let (_file, base) = crate::region::map_new(&path, size)?;
        MAPPED_BYTES.fetch_add(size as u64, Ordering::Relaxed);
        let seg = Self {
            path,
            base,
            size,
            slots,
            slot_bytes,
            linked: AtomicBool::new(true),
            next: AtomicUsize::new(0),
        };
        // SAFETY: the header is inside the mapping and nothing else
        // references it yet (the file is new and unnamed to anyone).
        unsafe {
            std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), seg.base, MAGIC.len());
            std::ptr::write_unaligned(seg.base.add(8).cast::<u64>(), slots as u64);
            std::ptr::write_unaligned(seg.base.add(16).cast::<u64>(), slot_bytes as u64);
        }
        Ok(seg)
    }

    /// What the trainer needs to map it.
    pub fn info(&self) -> SegmentInfo {
        SegmentInfo {
            path: self.path.display().to_string(),
            size: self.size as u64,
            slots: self.slots as u64,
            slot_bytes: self.slot_bytes as u64,
        }
    }

    /// Where its file is (or was, once unlinked).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    fn byte(&self, at: usize) -> &AtomicU8 {
        assert!(at < HEADER);
        // SAFETY: `at` is inside the header, which lives as long as `self`;
        // a u8 atomic has no alignment needs, and every access to the
        // header's flags (here and in the trainer's process) is a single
        // byte load or store.
        unsafe { AtomicU8::from_ptr(self.base.add(at)) }
    }

    /// Removes the file once the trainer has mapped the segment (the
    /// memory stays until both sides unmap it, and nothing is left behind
    /// if either dies).
    fn unlink_if_mapped(&self) {
        if self.byte(MAPPED_AT).load(Ordering::Acquire) != 0
            && self.linked.swap(false, Ordering::AcqRel)
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Waits, up to `limit`, until the trainer has mapped the segment:
    /// the end of a stream must not unlink it before the trainer opened
    /// it (its batches would be lost with the name).
    pub async fn until_mapped(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            self.unlink_if_mapped();
            if !self.linked.load(Ordering::Acquire) || Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Whether the trainer has mapped it (and its file is gone).
    pub fn mapped(&self) -> bool {
        !self.linked.load(Ordering::Acquire)
    }

    /// A free slot, round-robin from the last one used.
    fn take_free(&self) -> Option<usize> {
        self.unlink_if_mapped();
        let next = self.next.load(Ordering::Relaxed);
        for i in 0..self.slots {
            let s = (next + i) % self.slots;
            if self
                .byte(STATES_AT + s)
                .compare_exchange(FREE, USED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.next.store((s + 1) % self.slots, Ordering::Relaxed);
                return Some(s);
            }
        }
        None
    }

    /// Writes `m` into `slot` as an encapsulated IPC message.
    fn write(&self, slot: usize, m: &SlicedMessage) -> usize {
        let len = message_len(m);
        assert!(len <= self.slot_bytes && slot < self.slots);
        // SAFETY: the slot is inside the mapping and was FREE (the trainer
        // no longer reads it) and is now USED by the caller, who won its
        // exchange in `take_free`: no one else reads or writes these bytes
        // until the trainer receives its number.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(
                self.base.add(HEADER + slot * self.slot_bytes),
                self.slot_bytes,
            )
        };
        let meta_len = m.header.len().next_multiple_of(8);
        dst[..4].copy_from_slice(&0xFFFF_FFFFu32.to_le_bytes());
        dst[4..8].copy_from_slice(&(meta_len as i32).to_le_bytes());
        dst[8..8 + m.header.len()].copy_from_slice(&m.header);
        dst[8 + m.header.len()..8 + meta_len].fill(0);
        // A computed piece (a finished column) writes its values here, once.
        m.write_body(&mut dst[8 + meta_len..len]);
        len
    }

    /// Puts the record-batch message `m` in a free slot, waiting up to
    /// [`SLOT_WAIT`] for one; `None` when it does not fit or no slot came
    /// free (send it over Flight instead). The copy (the values' one copy
    /// on this path, from the pieces `m`'s body borrows) runs on the
    /// blocking pool: the runtime serving streams only waits for it.
    pub async fn put(self: &Arc<Self>, m: SlicedMessage) -> Result<Option<SlotRef>, String> {
        if message_len(&m) > self.slot_bytes {
            return Ok(None);
        }
        let deadline = Instant::now() + SLOT_WAIT;
        let mut pause = Duration::from_micros(50);
        let slot = loop {
            if let Some(s) = self.take_free() {
                break s;
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(2));
        };
        let seg = Arc::clone(self);
        let len = tokio::task::spawn_blocking(move || seg.write(slot, &m))
            .await
            .map_err(|e| format!("writing slot {slot}: {e}"))?;
        Ok(Some(SlotRef {
            slot: slot as u64,
            len: len as u64,
        }))
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if *self.linked.get_mut() {
            let _ = std::fs::remove_file(&self.path);
        }
        // A trainer that kept its mapping for our next stream lets go.
        self.byte(RETIRED_AT).store(1, Ordering::Release);
        // SAFETY: `base` and `size` are the mapping `create` made, unmapped
        // once, here; nothing borrows it past `self`.
        unsafe { libc::munmap(self.base.cast(), self.size) };
        MAPPED_BYTES.fetch_sub(self.size as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::RecordBatch;
    use arrow::array::{Int64Array, StringArray};
    use arrow::ipc::reader::StreamReader;
    use sluice_flight::gather::encode_batch;
    use std::sync::Arc;

    fn batch() -> RecordBatch {
        RecordBatch::try_from_iter([
            (
                "k",
                Arc::new(StringArray::from(vec!["a", "bb", "ccc"])) as _,
            ),
            ("v", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
        ])
        .unwrap()
    }

    #[tokio::test]
    async fn a_slot_holds_the_batch_as_an_ipc_message() {
        let seg = Arc::new(Segment::create(2, 4096).unwrap());
        let b = batch();
        let r = seg.put(encode_batch(&b).unwrap()).await.unwrap().unwrap();
        // Read the slot back as a stream: schema message, then the slot.
        let mut w = arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &b.schema()).unwrap();
        w.finish().unwrap();
        let mut stream = w.into_inner().unwrap();
        // Drop the end-of-stream marker: the slot's message follows.
        stream.truncate(stream.len() - 8);
        // SAFETY: the slot is inside the mapping, written above.
        let slot = unsafe {
            std::slice::from_raw_parts(
                seg.base.add(HEADER + r.slot as usize * seg.slot_bytes),
                r.len as usize,
            )
        };
        stream.extend_from_slice(slot);
        let got: Vec<_> = StreamReader::try_new(&stream[..], None)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got, vec![b]);
    }

    #[tokio::test]
    async fn a_full_segment_sends_over_flight_and_frees_on_drop() {
        let seg = Arc::new(Segment::create(2, 4096).unwrap());
        let path = seg.path.clone();
        assert!(path.exists());
        assert!(
            seg.put(encode_batch(&batch()).unwrap())
                .await
                .unwrap()
                .is_some()
        );
        assert!(
            seg.put(encode_batch(&batch()).unwrap())
                .await
                .unwrap()
                .is_some()
        );
        // Both slots held: the third batch waits, then gives up.
        let t = Instant::now();
        assert!(
            seg.put(encode_batch(&batch()).unwrap())
                .await
                .unwrap()
                .is_none()
        );
        assert!(t.elapsed() >= SLOT_WAIT);
        // The trainer frees one: it is reused.
        seg.byte(STATES_AT + 1).store(FREE, Ordering::Release);
        assert_eq!(
            seg.put(encode_batch(&batch()).unwrap())
                .await
                .unwrap()
                .unwrap()
                .slot,
            1
        );
        // Mapped: the name goes at the next slot taken.
        seg.byte(MAPPED_AT).store(1, Ordering::Release);
        let _ = seg.take_free();
        assert!(!path.exists());
        // Counted while mapped (other tests' segments come and go in the
        // same process, so only this one's share is certain).
        assert!(mapped_bytes() >= seg.size as u64);
        drop(seg);
        assert!(!path.exists());
    }
}
