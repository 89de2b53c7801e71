/*
 * Decodes one window of a JPEG with libjpeg-turbo's libjpeg API, at M/8
 * DCT scale: rows above the window are skipped (entropy-decoded, no IDCT),
 * columns outside it are cropped to the iMCU boundary
 * (jpeg_crop_scanline), and rows below it are entropy-decoded without
 * IDCT up to the last one, so that a truncated or corrupt file fails here
 * as it fails a full decode. It is the technique behind tf.data's
 * decode_and_crop_jpeg.
 *
 * libjpeg reports fatal errors through error_exit, which must not return:
 * this file keeps the setjmp/longjmp that requires on the C side, so that
 * no Rust frame is ever jumped over. Warnings (JWRN_*) are collected and
 * handed back with the pixels; the caller decides which ones it tolerates.
 */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

struct sluice_error {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  char *message;
  unsigned long message_size;
  int warned;
  int sticky;
};

static void sluice_error_exit(j_common_ptr cinfo) {
  struct sluice_error *err = (struct sluice_error *)cinfo->err;
  char buf[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, buf);
  snprintf(err->message, err->message_size, "%s", buf);
  longjmp(err->jump, 1);
}

static void sluice_emit_message(j_common_ptr cinfo, int level) {
  struct sluice_error *err = (struct sluice_error *)cinfo->err;
  if (level >= 0 || err->sticky)
    return;
  /* A file that ends early is remembered over any later warning: its
   * missing rows would be grey. */
  char buf[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, buf);
  snprintf(err->message, err->message_size, "%s", buf);
  err->warned = 1;
  int code = cinfo->err->msg_code;
  err->sticky = code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER;
}

/*
 * Returns 0 when the window was decoded, 1 when it was decoded and libjpeg
 * warned (the warning is in `message`), -1 on an error (in `message`).
 * `left`, `top`, `width`, `height` are in the scaled image's pixels;
 * `*out_left` and `*out_width` receive the columns actually decoded
 * (widened to the iMCU grid), written as rows of `*out_width` pixels into
 * `out`, which holds at least the scaled width times `height` pixels.
 */
int sluice_jpeg_window(const unsigned char *data, unsigned long size,
                       int components, unsigned int scale_num,
                       unsigned int left, unsigned int top,
                       unsigned int width, unsigned int height,
                       unsigned char *out, unsigned long out_size,
                       unsigned int *out_left, unsigned int *out_width,
                       char *message, unsigned long message_size) {
  struct jpeg_decompress_struct cinfo;
  struct sluice_error err;
  memset(&err, 0, sizeof(err));
  err.message = message;
  err.message_size = message_size;
  message[0] = 0;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = sluice_error_exit;
  err.pub.emit_message = sluice_emit_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, size);
  jpeg_read_header(&cinfo, TRUE);
  switch (components) {
  case 1:
    cinfo.out_color_space = JCS_GRAYSCALE;
    break;
  case 3:
    cinfo.out_color_space = JCS_RGB;
    break;
  case 4:
    cinfo.out_color_space = JCS_EXT_RGBA;
    break;
  default:
    snprintf(message, message_size, "unsupported number of components %d", components);
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  cinfo.scale_num = scale_num;
  cinfo.scale_denom = 8;
  jpeg_start_decompress(&cinfo);
  if (left >= cinfo.output_width || top >= cinfo.output_height ||
      width == 0 || height == 0 || width > cinfo.output_width - left ||
      height > cinfo.output_height - top) {
    snprintf(message, message_size,
             "window %ux%u at (%u, %u) outside the %ux%u scaled image",
             width, height, left, top, cinfo.output_width, cinfo.output_height);
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  JDIMENSION x = left, w = width;
  if (w < cinfo.output_width)
    jpeg_crop_scanline(&cinfo, &x, &w);
  unsigned long stride = (unsigned long)w * (unsigned long)components;
  if (stride * height > out_size) {
    snprintf(message, message_size, "window buffer too small");
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  if (top > 0)
    jpeg_skip_scanlines(&cinfo, top);
  for (unsigned int row = 0; row < height; row++) {
    JSAMPROW rows[1] = {out + stride * row};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1)
      ERREXIT(&cinfo, JERR_FILE_READ);
  }
  /* Skipping straight to the end would only mark the input finished
   * (libjpeg-turbo does not decode what it skips there), so skip to the
   * last row and read it: every entropy-coded byte up to the end of the
   * image is then checked, as a full decode checks it. */
  if (cinfo.output_scanline < cinfo.output_height) {
    JSAMPARRAY last = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE,
                                                 (JDIMENSION)stride, 1);
    JDIMENSION rest = cinfo.output_height - cinfo.output_scanline - 1;
    if (rest > 0)
      jpeg_skip_scanlines(&cinfo, rest);
    if (jpeg_read_scanlines(&cinfo, last, 1) != 1)
      ERREXIT(&cinfo, JERR_FILE_READ);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  *out_left = x;
  *out_width = w;
  return err.warned ? 1 : 0;
}
