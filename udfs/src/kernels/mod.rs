//! The pixel, frame and array work behind the UDFs, as plain functions.
//!
//! Kernels know nothing of Arrow or DataFusion: they take bytes or borrowed
//! views and write into caller-provided buffers, and they report bad input
//! as a `String` reason that the UDF turns into the session's policy.

pub mod bmp_rle;
pub mod crop;
pub mod decode;
pub mod fallback;
pub mod ffmpeg_still;
pub mod flip;
pub mod gif_grey;
pub mod ico_entries;
pub mod jpeg_window;
pub mod libtiff;
pub mod normalize;
pub mod npy;
pub mod npz;
pub mod resize;
pub mod tiff_planar;
pub mod video;
pub mod volume;
