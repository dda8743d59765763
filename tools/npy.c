/* npy.c: the strict .npy reader of npy.h. The header is a Python dict literal; this reads only
 * the form NumPy writes ({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded
 * with spaces and a newline) and checks every size against the file before it allocates. */
#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(char *msg, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, size, fmt, ap);
  va_end(ap);
  return -1;
}

int64_t npy_numel(const npy_array *a) {
  int64_t n = 1;
  for (int i = 0; i < a->rank; i++) n *= a->shape[i];
  return n;
}

void npy_free(npy_array *a) {
  if (!a) return;
  free(a->data);
  memset(a, 0, sizeof *a);
}

/* The header text [p, end): skips spaces. */
static const char *skip(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  return p;
}

/* Expects the literal s at *p; advances past it. */
static int expect(const char **p, const char *end, const char *s) {
  size_t n = strlen(s);
  *p = skip(*p, end);
  if ((size_t)(end - *p) < n || memcmp(*p, s, n) != 0) return -1;
  *p += n;
  return 0;
}

/* A quoted string into buf (at most size - 1 characters, no escapes). */
static int quoted(const char **p, const char *end, char *buf, size_t size) {
  *p = skip(*p, end);
  if (*p >= end || (**p != '\'' && **p != '"')) return -1;
  char q = *(*p)++;
  size_t n = 0;
  while (*p < end && **p != q) {
    if (n + 1 >= size || **p == '\\') return -1;
    buf[n++] = *(*p)++;
  }
  if (*p >= end) return -1;
  (*p)++;
  buf[n] = '\0';
  return 0;
}

/* The shape tuple: "()" , "(5,)", "(2, 3)", at most PMAP_MAX_RANK non-negative extents. */
static int parse_shape(const char **p, const char *end, npy_array *a, char *msg, size_t size) {
  if (expect(p, end, "(")) return fail(msg, size, "the header's shape is not a tuple");
  a->rank = 0;
  for (;;) {
    *p = skip(*p, end);
    if (*p < end && **p == ')') {
      (*p)++;
      return 0;
    }
    if (a->rank == PMAP_MAX_RANK)
      return fail(msg, size, "the array has more than %d axes", PMAP_MAX_RANK);
    if (*p >= end || **p < '0' || **p > '9')
      return fail(msg, size, "the header's shape has a bad extent");
    int64_t v = 0;
    while (*p < end && **p >= '0' && **p <= '9') {
      if (v > (INT64_MAX - 9) / 10) return fail(msg, size, "an extent of the shape overflows");
      v = v * 10 + (*(*p)++ - '0');
    }
    a->shape[a->rank++] = v;
    *p = skip(*p, end);
    if (*p < end && **p == ',')
      (*p)++;
    else if (*p >= end || **p != ')')
      return fail(msg, size, "the header's shape is malformed");
  }
}

/* Parses the header dict into descr, fortran order and shape. */
static int parse_header(const char *h, size_t len, npy_array *a, char *msg, size_t size) {
  const char *p = h, *end = h + len;
  int have_descr = 0, have_order = 0, have_shape = 0;
  if (expect(&p, end, "{")) return fail(msg, size, "the header is not a dict");
  for (;;) {
    p = skip(p, end);
    if (p < end && *p == '}') break;
    char key[32];
    if (quoted(&p, end, key, sizeof key) || expect(&p, end, ":"))
      return fail(msg, size, "the header's dict is malformed");
    if (!strcmp(key, "descr") && !have_descr) {
      if (quoted(&p, end, a->descr, sizeof a->descr))
        return fail(msg, size, "the header's descr is not a short string");
      have_descr = 1;
    } else if (!strcmp(key, "fortran_order") && !have_order) {
      if (!expect(&p, end, "True"))
        return fail(msg, size,
                    "fortran_order is True: save the array in C order "
                    "(numpy.ascontiguousarray)");
      if (expect(&p, end, "False")) return fail(msg, size, "fortran_order is not True or False");
      have_order = 1;
    } else if (!strcmp(key, "shape") && !have_shape) {
      if (parse_shape(&p, end, a, msg, size)) return -1;
      have_shape = 1;
    } else {
      return fail(msg, size, "the header has an unexpected or repeated key '%s'", key);
    }
    p = skip(p, end);
    if (p < end && *p == ',') p++;
  }
  p++;
  while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
  if (p != end) return fail(msg, size, "the header has text after its dict");
  if (!have_descr || !have_order || !have_shape)
    return fail(msg, size, "the header lacks %s",
                !have_descr   ? "descr"
                : !have_order ? "fortran_order"
                              : "shape");
  return 0;
}

/* Converts the raw little-endian payload into a->data (f32 or i32). */
static int convert(const unsigned char *src, int64_t n, npy_array *a, char *msg, size_t size) {
  const char *d = a->descr;
  int f4 = !strcmp(d, "<f4"), f8 = !strcmp(d, "<f8"), i4 = !strcmp(d, "<i4"),
      i8 = !strcmp(d, "<i8");
  a->dtype = f4 || f8 ? PMAP_F32 : PMAP_I32;
  a->data = malloc((size_t)(n ? n : 1) * 4);
  if (!a->data) return fail(msg, size, "out of memory for %lld elements", (long long)n);
  for (int64_t i = 0; i < n; i++) {
    if (f4 || i4) {
      memcpy((char *)a->data + i * 4, src + i * 4, 4);
    } else if (f8) {
      double v;
      memcpy(&v, src + i * 8, 8);
      float f = (float)v;
      if (isfinite(v) && !isfinite(f)) /* it would train on an infinity the file does not hold */
        return fail(msg, size, "element %lld is %.17g, finite but beyond float32's range",
                    (long long)i, v);
      ((float *)a->data)[i] = f;
    } else if (i8) {
      int64_t v;
      memcpy(&v, src + i * 8, 8);
      if (v < INT32_MIN || v > INT32_MAX)
        return fail(msg, size, "element %lld is %lld, outside the int32 range", (long long)i,
                    (long long)v);
      ((int32_t *)a->data)[i] = (int32_t)v;
    }
  }
  return 0;
}

int npy_parse(const unsigned char *buf, size_t len, npy_array *out, char *msg, size_t size) {
  memset(out, 0, sizeof *out);
  if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0)
    return fail(msg, size, "not a .npy file (no \\x93NUMPY magic)");
  int major = buf[6];
  if (major < 1 || major > 3)
    return fail(msg, size, ".npy format version %d.%d is not 1.0, 2.0 or 3.0", major, buf[7]);
  size_t hlen = 0, pre = major == 1 ? 10 : 12;
  if (len < pre) return fail(msg, size, "the file ends inside its preamble");
  hlen = major == 1
             ? (size_t)buf[8] | (size_t)buf[9] << 8
             : (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
  if (hlen > len - pre)
    return fail(msg, size, "the header of %zu bytes runs past the end of the %zu-byte file", hlen,
                len);
  npy_array a;
  memset(&a, 0, sizeof a);
  if (parse_header((const char *)buf + pre, hlen, &a, msg, size)) return -1;
  int item = 0;
  if (!strcmp(a.descr, "<f4") || !strcmp(a.descr, "<i4")) item = 4;
  if (!strcmp(a.descr, "<f8") || !strcmp(a.descr, "<i8")) item = 8;
  if (!item)
    return fail(msg, size, "dtype '%s' is not supported (little-endian f4, f8, i4 or i8)", a.descr);
  if (a.rank < 1) return fail(msg, size, "a scalar (shape ()) is not an array of rows");
  int64_t n = 1;
  for (int i = 0; i < a.rank; i++)
    if (__builtin_mul_overflow(n, a.shape[i], &n) || n > INT64_MAX / 8)
      return fail(msg, size, "the shape's element count overflows");
  size_t data = len - pre - hlen;
  uint64_t need = (uint64_t)n * (uint64_t)item; /* n <= INT64_MAX / 8: no overflow */
  if (need != data)
    return fail(msg, size, "the shape needs %llu bytes of data; the file has %zu%s",
                (unsigned long long)need, data, data < need ? " (truncated)" : "");
  if (convert(buf + pre + hlen, n, &a, msg, size)) {
    free(a.data);
    return -1;
  }
  *out = a;
  return 0;
}

int npy_load(const char *path, size_t max_bytes, npy_array *out, char *msg, size_t size) {
  memset(out, 0, sizeof *out);
  /* Opened without blocking, so that a FIFO without a writer is refused, not waited on. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fail(msg, size, "%s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return fail(msg, size, "%s: not a regular file", path);
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return fail(msg, size, "%s: %s", path, strerror(errno));
  }
  unsigned char *buf = NULL;
  long len = -1;
  if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
  if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return fail(msg, size, "%s: cannot read its size", path);
  }
  if ((unsigned long)len > max_bytes) {
    fclose(f);
    return fail(msg, size, "%s: %ld bytes is more than the %zu this reads", path, len, max_bytes);
  }
  buf = malloc((size_t)len + 1);
  if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
    free(buf);
    fclose(f);
    return fail(msg, size, "%s: cannot read it", path);
  }
  fclose(f);
  char inner[400];
  int rc = npy_parse(buf, (size_t)len, out, inner, sizeof inner);
  free(buf);
  if (rc) return fail(msg, size, "%s: %s", path, inner);
  return 0;
}
