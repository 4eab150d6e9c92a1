/*
 * Whole files in, whole files out. Arrays and frames are read completely: a frame is
 * validated against exactly the bytes the file holds.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec.h"

int codec_file_read(const char* cmd, const char* path, uint8_t** buf, size_t* len) {
  bool is_stdin = strcmp(path, "-") == 0;
  FILE* f = is_stdin ? stdin : fopen(path, "rb");
  if (f == NULL) {
    codec_err(cmd, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  /* A regular file is read in one allocation: its size plus one byte to see EOF. */
  size_t cap = 1u << 20, used = 0;
  struct stat sb;
  if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size < SIZE_MAX / 2)
    cap = (size_t)sb.st_size + 1;
  uint8_t* p = malloc(cap);
  int rc = -1;
  if (p == NULL) goto oom;
  for (;;) {
    if (used == cap) {
      if (cap > SIZE_MAX / 2) goto oom;
      uint8_t* q = realloc(p, cap * 2);
      if (q == NULL) goto oom;
      p = q;
      cap *= 2;
    }
    size_t got = fread(p + used, 1, cap - used, f);
    used += got;
    if (got == 0) break;
  }
  if (ferror(f)) {
    codec_err(cmd, "cannot read %s: %s", path, strerror(errno));
    goto out;
  }
  *buf = p;
  *len = used;
  p = NULL;
  rc = 0;
  goto out;
oom:
  codec_err(cmd, "out of memory reading %s (%zu bytes so far)", path, used);
out:
  free(p);
  if (!is_stdin) fclose(f);
  return rc;
}

int codec_file_write(const char* cmd, const char* path, const void* buf, size_t len) {
  bool is_stdout = strcmp(path, "-") == 0;
  FILE* f = is_stdout ? stdout : fopen(path, "wb");
  if (f == NULL) {
    codec_err(cmd, "cannot create %s: %s", path, strerror(errno));
    return -1;
  }
  size_t put = len > 0 ? fwrite(buf, 1, len, f) : 0;
  int err = put != len ? errno : 0;
  /* fclose flushes: a full disk may only show here. */
  int rc = is_stdout ? fflush(f) : fclose(f);
  if (put != len || rc != 0) {
    codec_err(cmd, "cannot write %s: %s", path, strerror(err ? err : errno));
    return -1;
  }
  return 0;
}

int codec_array_read(const char* cmd, const char* path, agoq_dtype t, uint8_t** buf, size_t* n) {
  size_t len = 0;
  if (codec_file_read(cmd, path, buf, &len) != 0) return -1;
  size_t es = agoq_dtype_size(t);
  if (len % es != 0) {
    codec_err(cmd, "%s: %zu bytes is not a whole number of %s elements (%zu bytes each)", path,
              len, agoq_dtype_name(t), es);
    free(*buf);
    *buf = NULL;
    return -1;
  }
  *n = len / es;
  return 0;
}
