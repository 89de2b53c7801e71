//! The pixel, frame and array work behind the UDFs, as plain functions.
//!
//! Kernels know nothing of Arrow or DataFusion: they take bytes or borrowed
//! views and write into caller-provided buffers, and they report bad input
//! as a `String` reason that the UDF turns into the session's policy.
//!
//! Modules:
//! - [`bmp_rle`]: run-length encoded BMPs (RLE8, RLE4), expanded by Pillow's
//!   rules;
//! - [`crop`]: crops: centre crops with zero padding, and torchvision's
//!   random resized crop;
//! - [`decode`]: image decoding, full-size or JPEG DCT-domain downscaled;
//! - [`fallback`]: `Fallback`: the library that reads a file the `image`
//!   crate refuses, chosen by the file's first bytes;
//! - [`ffmpeg_still`]: AVIF still images, read by FFmpeg (the same
//!   libavformat/libavcodec the video path links);
//! - [`flip`]: horizontal flip;
//! - [`gif_grey`]: GIFs whose first frame has no colour table at all, neither
//!   its own nor a global one;
//! - [`ico_entries`]: ICO files whose directory disagrees with the image an
//!   entry holds;
//! - [`jpeg_window`]: windowed JPEG decoding: only the rows and iMCU columns
//!   a crop needs, at M/8 DCT scale;
//! - [`libtiff`]: TIFFs the `tiff` crate refuses, read by libtiff (Debian's
//!   `libtiff6`, the library Pillow reads TIFF with);
//! - [`normalize`]: uint8 HWC → float32 CHW with per-channel mean and
//!   standard deviation;
//! - [`npy`]: NumPy `.npy` parsing: header, dtype, shape;
//! - [`npz`]: NumPy `.npz` archives (zip of `.npy` members, stored or
//!   deflated);
//! - [`resize`]: image resampling with SIMD convolution (fast_image_resize);
//! - [`tiff_planar`]: tiled TIFFs whose samples are stored in separate
//!   planes;
//! - [`video`]: video clips through FFmpeg (ffmpeg-next): probe, and decode
//!   sampled frames resized to RGB;
//! - [`volume`]: volumes: 3-D crops and trilinear resizing over an array's
//!   first three dimensions.

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
