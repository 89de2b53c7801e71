//! TIFFs the `tiff` crate refuses, read by libtiff (Debian's `libtiff6`,
//! the library Pillow reads TIFF with).
//!
//! The `tiff` crate reads the common layouts fast and exactly; real
//! collections also hold CCITT Group 3/4 fax pages, LZMA, old-style JPEG,
//! CIELab, YCbCr, palette and 2- or 4-bit grey TIFFs, BigTIFF, and files
//! whose page count says zero. For those, [`header`] and [`decode`] ask
//! libtiff through its memory I/O (`TIFFClientOpenExt` over the object's
//! bytes: no temporary file) and its RGBA interface
//! (`TIFFReadRGBAImageOriented`), which turns every photometric
//! interpretation and bit depth libtiff knows into 8-bit RGBA, top row
//! first, as Pillow's libtiff path does.
//!
//! libtiff's messages do not go to stderr: a handler per open file
//! collects them, and the first error becomes the sample's reason. The
//! image's size is checked against the caller's limits before any pixel
//! buffer is made, and libtiff's own allocations are capped at the same
//! size (`TIFFOpenOptionsSetMaxSingleMemAlloc`).
//!
//! The bindings are the handful of functions used, declared here against
//! libtiff 4.5's ABI (the first with `TIFFOpenOptions`).

use std::ffi::{CStr, c_char, c_int, c_void};

use image::{DynamicImage, RgbaImage};

/// libtiff's handle.
#[repr(C)]
struct Tiff {
    _opaque: [u8; 0],
}

/// libtiff's open options.
#[repr(C)]
struct TiffOpenOptions {
    _opaque: [u8; 0],
}

type ReadWrite = unsafe extern "C" fn(*mut c_void, *mut c_void, isize) -> isize;
type SeekProc = unsafe extern "C" fn(*mut c_void, u64, c_int) -> u64;
type CloseProc = unsafe extern "C" fn(*mut c_void) -> c_int;
type SizeProc = unsafe extern "C" fn(*mut c_void) -> u64;
type MapProc = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut u64) -> c_int;
type UnmapProc = unsafe extern "C" fn(*mut c_void, *mut c_void, u64);
/// `int (*)(TIFF*, void* user_data, const char* module, const char* fmt,
/// va_list)`: the `va_list` is passed on to `vsnprintf` untouched, as the
/// pointer-sized value the C ABI hands over.
type HandlerExtR = unsafe extern "C" fn(
    *mut Tiff,
    *mut c_void,
    *const c_char,
    *const c_char,
    *mut c_void,
) -> c_int;

#[link(name = "tiff")]
unsafe extern "C" {
    fn TIFFOpenOptionsAlloc() -> *mut TiffOpenOptions;
    fn TIFFOpenOptionsFree(opts: *mut TiffOpenOptions);
    fn TIFFOpenOptionsSetMaxSingleMemAlloc(opts: *mut TiffOpenOptions, max: isize);
    fn TIFFOpenOptionsSetErrorHandlerExtR(
        opts: *mut TiffOpenOptions,
        handler: HandlerExtR,
        data: *mut c_void,
    );
    fn TIFFOpenOptionsSetWarningHandlerExtR(
        opts: *mut TiffOpenOptions,
        handler: HandlerExtR,
        data: *mut c_void,
    );
    fn TIFFClientOpenExt(
        name: *const c_char,
        mode: *const c_char,
        client: *mut c_void,
        read: ReadWrite,
        write: ReadWrite,
        seek: SeekProc,
        close: CloseProc,
        size: SizeProc,
        map: MapProc,
        unmap: UnmapProc,
        opts: *mut TiffOpenOptions,
    ) -> *mut Tiff;
    fn TIFFClose(tif: *mut Tiff);
    fn TIFFGetField(tif: *mut Tiff, tag: u32, ...) -> c_int;
    fn TIFFRGBAImageOK(tif: *mut Tiff, emsg: *mut c_char) -> c_int;
    fn TIFFReadRGBAImageOriented(
        tif: *mut Tiff,
        width: u32,
        height: u32,
        raster: *mut u32,
        orientation: c_int,
        stop_on_error: c_int,
    ) -> c_int;
    fn vsnprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ap: *mut c_void) -> c_int;
}

const TIFFTAG_IMAGEWIDTH: u32 = 256;
const TIFFTAG_IMAGELENGTH: u32 = 257;
const TIFFTAG_SAMPLESPERPIXEL: u32 = 277;
const ORIENTATION_TOPLEFT: c_int = 1;

/// The object being read, and where libtiff is in it.
struct Source<'a> {
    bytes: &'a [u8],
    at: u64,
}

unsafe extern "C" fn read(client: *mut c_void, buf: *mut c_void, n: isize) -> isize {
    // SAFETY: `client` is the `Source` that `Open::new` passed to
    // TIFFClientOpenExt, alive for as long as the handle; libtiff asks for
    // at most `n` bytes into `buf`, which it owns.
    let src = unsafe { &mut *client.cast::<Source<'_>>() };
    let start = usize::try_from(src.at)
        .unwrap_or(usize::MAX)
        .min(src.bytes.len());
    let len = usize::try_from(n).unwrap_or(0).min(src.bytes.len() - start);
    // SAFETY: `buf` holds `n` ≥ `len` writable bytes (libtiff's contract),
    // and `start + len` is within `bytes`.
    unsafe {
        std::ptr::copy_nonoverlapping(src.bytes.as_ptr().add(start), buf.cast::<u8>(), len);
    }
    src.at = (start + len) as u64;
    len as isize
}

unsafe extern "C" fn write(_: *mut c_void, _: *mut c_void, _: isize) -> isize {
    -1
}

unsafe extern "C" fn seek(client: *mut c_void, off: u64, whence: c_int) -> u64 {
    // SAFETY: as in `read`.
    let src = unsafe { &mut *client.cast::<Source<'_>>() };
    let base = match whence {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => src.at,
        libc::SEEK_END => src.bytes.len() as u64,
        _ => return u64::MAX,
    };
    // `off` is a signed offset in an unsigned type (toff_t).
    src.at = base.wrapping_add(off);
    src.at
}

unsafe extern "C" fn close(_: *mut c_void) -> c_int {
    0
}

unsafe extern "C" fn size(client: *mut c_void) -> u64 {
    // SAFETY: as in `read`.
    let src = unsafe { &*client.cast::<Source<'_>>() };
    src.bytes.len() as u64
}

unsafe extern "C" fn no_map(_: *mut c_void, _: *mut *mut c_void, _: *mut u64) -> c_int {
    0
}

unsafe extern "C" fn no_unmap(_: *mut c_void, _: *mut c_void, _: u64) {}

/// Keeps libtiff's first error message of one open file.
unsafe extern "C" fn on_error(
    _: *mut Tiff,
    data: *mut c_void,
    module: *const c_char,
    fmt: *const c_char,
    ap: *mut c_void,
) -> c_int {
    // SAFETY: `data` is the `Option<String>` that `Open::new` registered,
    // alive until the handle is closed.
    let first = unsafe { &mut *data.cast::<Option<String>>() };
    if first.is_none() {
        let mut buf = [0 as c_char; 512];
        // SAFETY: `fmt` and `ap` are libtiff's printf-style message, passed
        // on as received; vsnprintf writes at most `buf.len()` bytes and
        // terminates them.
        unsafe { vsnprintf(buf.as_mut_ptr(), buf.len(), fmt, ap) };
        // SAFETY: vsnprintf terminated `buf`; `module` is null or libtiff's
        // C string.
        let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
        let module = if module.is_null() {
            String::new()
        } else {
            // SAFETY: see above.
            format!("{}: ", unsafe { CStr::from_ptr(module) }.to_string_lossy())
        };
        *first = Some(format!("{module}{msg}"));
    }
    1
}

/// Drops libtiff's warnings (a warning leaves the image readable).
unsafe extern "C" fn on_warning(
    _: *mut Tiff,
    _: *mut c_void,
    _: *const c_char,
    _: *const c_char,
    _: *mut c_void,
) -> c_int {
    1
}

/// One open TIFF over borrowed bytes; closed on drop.
struct Open<'a> {
    tif: *mut Tiff,
    // Boxed so their addresses, given to libtiff, stay put.
    _source: Box<Source<'a>>,
    error: Box<Option<String>>,
}

impl<'a> Open<'a> {
    fn new(bytes: &'a [u8], max_alloc: u64) -> Result<Self, String> {
        let mut source = Box::new(Source { bytes, at: 0 });
        let mut error: Box<Option<String>> = Box::new(None);
        // SAFETY: the options are made, used by TIFFClientOpenExt (which
        // copies them) and freed here; the client data and handler data
        // are boxed, owned by the returned `Open`, and outlive the handle,
        // which `Drop` closes before they are freed.
        let tif = unsafe {
            let opts = TIFFOpenOptionsAlloc();
            if opts.is_null() {
                return Err("libtiff: out of memory".into());
            }
            TIFFOpenOptionsSetMaxSingleMemAlloc(
                opts,
                isize::try_from(max_alloc).unwrap_or(isize::MAX),
            );
            let data = std::ptr::from_mut::<Option<String>>(&mut error).cast::<c_void>();
            TIFFOpenOptionsSetErrorHandlerExtR(opts, on_error, data);
            TIFFOpenOptionsSetWarningHandlerExtR(opts, on_warning, std::ptr::null_mut());
            let tif = TIFFClientOpenExt(
                c"object".as_ptr(),
                c"rm".as_ptr(),
                std::ptr::from_mut::<Source<'a>>(&mut source).cast::<c_void>(),
                read,
                write,
                seek,
                close,
                size,
                no_map,
                no_unmap,
                opts,
            );
            TIFFOpenOptionsFree(opts);
            tif
        };
        if tif.is_null() {
            return Err(format!(
                "libtiff cannot open it: {}",
                error.take().unwrap_or_else(|| "not a TIFF".into())
            ));
        }
        Ok(Self {
            tif,
            _source: source,
            error,
        })
    }

    fn field_u32(&self, tag: u32) -> Option<u32> {
        let mut v: u32 = 0;
        // SAFETY: the three tags read here are uint32 in libtiff's field
        // table, written through the one pointer passed.
        let ok = unsafe { TIFFGetField(self.tif, tag, &mut v as *mut u32) };
        (ok == 1).then_some(v)
    }

    fn field_u16(&self, tag: u32) -> Option<u16> {
        let mut v: u16 = 0;
        // SAFETY: as above, for a uint16 tag.
        let ok = unsafe { TIFFGetField(self.tif, tag, &mut v as *mut u16) };
        (ok == 1).then_some(v)
    }

    /// Whether the RGBA interface has a conversion for this layout
    /// ("Sorry, can not handle images with 32-bit samples" where not),
    /// asked before any pixel is read so that such a file is refused at
    /// its header, at ingest.
    fn rgba_ok(&self) -> Result<(), String> {
        let mut msg = [0 as c_char; 1024];
        // SAFETY: `msg` is the 1024 bytes TIFFRGBAImageOK may write its
        // reason into (terminated).
        if unsafe { TIFFRGBAImageOK(self.tif, msg.as_mut_ptr()) } == 1 {
            return Ok(());
        }
        // SAFETY: terminated by TIFFRGBAImageOK, or still all zeros.
        let why = unsafe { CStr::from_ptr(msg.as_ptr()) }.to_string_lossy();
        Err(format!(
            "libtiff: {why} (not supported: convert the file to 8- or 16-bit integer \
             samples, e.g. `convert in.tif -depth 8 out.tif` with ImageMagick)"
        ))
    }

    fn reason(&mut self, what: &str) -> String {
        match self.error.take() {
            Some(e) => format!("libtiff {what}: {e}"),
            None => format!("libtiff {what}"),
        }
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        // SAFETY: `tif` came from TIFFClientOpenExt and is closed once.
        unsafe { TIFFClose(self.tif) }
    }
}

/// A TIFF's size and channels, as libtiff reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Samples per pixel the file declares.
    pub channels: u8,
}

/// Reads the first page's header.
pub fn header(bytes: &[u8]) -> Result<Header, String> {
    let mut open = Open::new(bytes, 64 << 20)?;
    let (Some(width), Some(height)) = (
        open.field_u32(TIFFTAG_IMAGEWIDTH),
        open.field_u32(TIFFTAG_IMAGELENGTH),
    ) else {
        return Err(open.reason("finds no image size"));
    };
    let channels = open.field_u16(TIFFTAG_SAMPLESPERPIXEL).unwrap_or(1);
    open.rgba_ok()?;
    Ok(Header {
        width,
        height,
        channels: u8::try_from(channels).unwrap_or(u8::MAX),
    })
}

/// Decodes the first page to RGBA. `check` refuses a size before any
/// pixel buffer is made; `max_alloc` caps each of libtiff's allocations.
pub fn decode(
    bytes: &[u8],
    max_alloc: u64,
    check: impl FnOnce(u32, u32) -> Result<(), String>,
) -> Result<DynamicImage, String> {
    let mut open = Open::new(bytes, max_alloc)?;
    let (Some(w), Some(h)) = (
        open.field_u32(TIFFTAG_IMAGEWIDTH),
        open.field_u32(TIFFTAG_IMAGELENGTH),
    ) else {
        return Err(open.reason("finds no image size"));
    };
    open.rgba_ok()?;
    check(w, h)?;
    let mut raster = vec![0u32; w as usize * h as usize];
    // SAFETY: `raster` holds w × h pixels, what TIFFReadRGBAImageOriented
    // writes for a w × h request.
    let ok = unsafe {
        TIFFReadRGBAImageOriented(open.tif, w, h, raster.as_mut_ptr(), ORIENTATION_TOPLEFT, 1)
    };
    if ok != 1 {
        return Err(open.reason("cannot decode it"));
    }
    // Each pixel is ABGR in a native u32 (TIFFGetR … TIFFGetA).
    let pixels = raster
        .iter()
        .flat_map(|&p| [p as u8, (p >> 8) as u8, (p >> 16) as u8, (p >> 24) as u8])
        .collect();
    RgbaImage::from_raw(w, h, pixels)
        .map(DynamicImage::ImageRgba8)
        .ok_or_else(|| "libtiff returned a short raster".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An uncompressed 3×2 RGB TIFF with a zero page count in its
    /// PageNumber tag (a layout real scanners write).
    fn tiff_rgb() -> Vec<u8> {
        let mut out = std::io::Cursor::new(Vec::new());
        let img =
            image::RgbImage::from_fn(3, 2, |x, y| image::Rgb([x as u8 * 40, y as u8 * 90, 7]));
        img.write_to(&mut out, image::ImageFormat::Tiff).unwrap();
        out.into_inner()
    }

    #[test]
    fn reads_a_tiff_from_memory_as_the_tiff_crate_does() {
        let bytes = tiff_rgb();
        let hd = header(&bytes).unwrap();
        assert_eq!((hd.width, hd.height, hd.channels), (3, 2, 3));
        let got = decode(&bytes, 1 << 20, |_, _| Ok(())).unwrap().into_rgb8();
        let want = image::load_from_memory(&bytes).unwrap().into_rgb8();
        assert_eq!(got, want);
    }

    #[test]
    fn names_what_libtiff_refuses_and_what_the_limits_refuse() {
        let err = header(b"II*\0garbage").unwrap_err();
        assert!(err.starts_with("libtiff cannot open it"), "{err}");
        let err = decode(&tiff_rgb(), 1 << 20, |w, h| Err(format!("{w}x{h} too big"))).unwrap_err();
        assert_eq!(err, "3x2 too big");
        // Cut inside the pixel data: an error, not grey rows.
        let bytes = tiff_rgb();
        let cut = &bytes[..bytes.len() - 40];
        assert!(decode(cut, 1 << 20, |_, _| Ok(())).is_err());
    }
}
