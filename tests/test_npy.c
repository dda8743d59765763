/* test_npy.c: the .npy reader of the tools: every supported dtype and format version, and a
 * clear error (never a crash) for every malformed file: magic, version, header length, dict,
 * dtype, byte order, fortran order, shape, truncation, extra bytes, int64 out of range. */
#include "../tools/npy.h"
#include "testutil.h"

/* A .npy image of version `major` with header dict `dict` and `data_len` bytes of data. */
static size_t build(unsigned char *buf, int major, const char *dict, const void *data,
                    size_t data_len) {
  size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
  size_t total = pre + dl + 1;
  size_t pad = (64 - total % 64) % 64;
  size_t hlen = dl + pad + 1;
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)major;
  buf[7] = 0;
  for (int i = 0; i < (major == 1 ? 2 : 4); i++) buf[8 + i] = (unsigned char)(hlen >> (8 * i));
  memcpy(buf + pre, dict, dl);
  memset(buf + pre + dl, ' ', pad);
  buf[pre + dl + pad] = '\n';
  memcpy(buf + pre + hlen, data, data_len);
  return pre + hlen + data_len;
}

static unsigned char img[4096];

static void ok_case(int major, const char *dict, const void *data, size_t len, pmap_dtype want,
                    int rank, const float *fv, const int32_t *iv, size_t n) {
  npy_array a;
  char msg[256];
  size_t total = build(img, major, dict, data, len);
  int rc = npy_parse(img, total, &a, msg, sizeof msg);
  CHECK(rc == 0, "v%d %s: %s", major, dict, msg);
  if (rc) return;
  CHECK(a.dtype == want && a.rank == rank && (size_t)npy_numel(&a) == n, "v%d %s: dtype %d rank %d",
        major, dict, (int)a.dtype, a.rank);
  if (fv) test_same_bits(dict, a.data, fv, n);
  if (iv) CHECK(memcmp(a.data, iv, n * 4) == 0, "%s: int values differ", dict);
  npy_free(&a);
}

static void bad_case(const unsigned char *buf, size_t len, const char *needle) {
  npy_array a;
  char msg[256] = "";
  int rc = npy_parse(buf, len, &a, msg, sizeof msg);
  CHECK(rc == -1, "accepted a bad file (wanted \"%s\")", needle);
  CHECK(strstr(msg, needle) != NULL, "message \"%s\" lacks \"%s\"", msg, needle);
  CHECK(a.data == NULL, "data left after a failure");
}

static void bad_dict(const char *dict, const void *data, size_t len, const char *needle) {
  size_t total = build(img, 1, dict, data, len);
  bad_case(img, total, needle);
}

int main(void) {
  float f[6] = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};
  double d[6] = {1.5, -2.0, 3.25, 0.0, 1e-3, 7.0};
  int32_t i4[4] = {0, 3, -1, 9};
  int64_t i8[4] = {0, 3, -1, 9}, big[2] = {1, (int64_t)1 << 40};
  for (int v = 1; v <= 3; v++) {
    ok_case(v, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f, sizeof f, PMAP_F32,
            2, f, NULL, 6);
    ok_case(v, "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }", d, sizeof d, PMAP_F32,
            1, f, NULL, 6);
    ok_case(v, "{'descr': '<i4', 'fortran_order': False, 'shape': (4, 1), }", i4, sizeof i4,
            PMAP_I32, 2, NULL, i4, 4);
    ok_case(v, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", i8, sizeof i8, PMAP_I32,
            1, NULL, i4, 4);
    ok_case(v, "{\"shape\": (1, 2, 3, 1), \"fortran_order\": False, \"descr\": \"<f4\"}", f,
            sizeof f, PMAP_F32, 4, f, NULL, 6);
  }
  bad_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (6,), }", f, sizeof f, "C order");
  bad_dict("{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", f, sizeof f, "'>f4'");
  bad_dict("{'descr': '<f2', 'fortran_order': False, 'shape': (6,), }", f, sizeof f, "'<f2'");
  bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (7,), }", f, sizeof f, "truncated");
  bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", f, sizeof f, "needs 20");
  bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", f, 4, "scalar");
  bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,6), }", f, sizeof f,
           "more than 4 axes");
  bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", f,
           sizeof f, "overflows");
  bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", f,
           sizeof f, "overflows");
  bad_dict("{'descr': '<f4', 'fortran_order': False, }", f, sizeof f, "lacks shape");
  bad_dict("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", f, sizeof f,
           "repeated");
  bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", f, sizeof f,
           "unexpected");
  bad_dict("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (6,)}", f, sizeof f, "True or False");
  bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} extra", f, sizeof f,
           "after its dict");
  bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}", f, sizeof f, "bad extent");
  bad_dict("['descr']", f, sizeof f, "not a dict");
  bad_dict("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", big, sizeof big,
           "outside the int32 range");
  /* Finite doubles beyond float32's range are refused (they would become infinities), naming
   * the element; infinities and NaN pass as they are, as in an f4 file. */
  double huge[3] = {1.0, -1e39, 2.0}, edge[3] = {3.4028234663852886e38, -INFINITY, NAN};
  bad_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", huge, sizeof huge,
           "beyond float32");
  float edge_f[3] = {3.4028234663852886e38f, -INFINITY, NAN};
  for (int v = 1; v <= 3; v++)
    ok_case(v, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", edge, sizeof edge,
            PMAP_F32, 1, edge_f, NULL, 3);
  size_t total =
      build(img, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", f, sizeof f);
  bad_case(img, 5, "magic");
  img[0] = 'X';
  bad_case(img, total, "magic");
  img[0] = 0x93;
  img[6] = 4;
  bad_case(img, total, "version 4");
  img[6] = 1;
  img[8] = 0xff;
  img[9] = 0xff;
  bad_case(img, total, "runs past the end");
  /* Every truncation of a valid file fails cleanly. */
  total = build(img, 2, "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }", d, sizeof d);
  for (size_t len = 0; len < total; len++) {
    npy_array a;
    char msg[256];
    CHECK(npy_parse(img, len, &a, msg, sizeof msg) == -1, "a truncation to %zu bytes parsed", len);
  }
  npy_array a;
  char msg[256];
  CHECK(npy_load("/nonexistent/x.npy", 1 << 20, &a, msg, sizeof msg) == -1 &&
            strstr(msg, "No such file"),
        "missing file: %s", msg);
  return test_exit("npy");
}
