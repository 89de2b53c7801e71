//! Compiles `csrc/jpeg_window.c`, the libjpeg glue behind windowed JPEG
//! decoding, and links it against the system libjpeg-turbo (the libjpeg
//! API; the TurboJPEG API comes through the `turbojpeg` crate).

fn main() {
    println!("cargo:rerun-if-changed=csrc/jpeg_window.c");
    cc::Build::new()
        .file("csrc/jpeg_window.c")
        .warnings(true)
        .extra_warnings(true)
        .compile("sluice_jpeg_window");
    println!("cargo:rustc-link-lib=jpeg");
}
