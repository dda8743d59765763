/* test_reduce_part.c: the CPU backend's piece of a reduce-scatter (backend_reduce_part, which
 * sharded gradients reduce each layer with), through pmap_run: for every device count, part
 * size, piece (inside one part, across several, at the start and the end, empty) and op, each
 * device gets exactly its part's elements of the piece reduced over the devices, at the place
 * recv_lo says, and nothing else of recv or of any send changes; a piece reduced in place (recv
 * the send, as the loss and flags are) too. Values are small integers, so every summation order
 * is exact and the expected values are known exactly; the mean divides such a sum by N, one
 * rounding, as the all-reduce's does. */
#include "runtime/runtime.h"
#include "testutil.h"

enum { MAX_N = 7, CAP = 7 * 48 };

typedef struct job {
  int n;
  size_t chunk, lo, count;
  pmap_redop op;
  int in_place;
  float send[MAX_N][CAP], recv[MAX_N][CAP];
  int taken[MAX_N];
} job;

static float value(int d, size_t i) { return (float)((int)((i * 3 + (size_t)d * 5) % 9) - 4 + d); }

static pmap_status reduce_job(pmap_device *dev, void *arg) {
  job *j = arg;
  int d = pmap_axis_index(dev);
  float *recv = j->in_place ? j->send[d] : j->recv[d];
  /* recv holds the flat layout from recv_lo: the piece's own start in place, else 0. */
  size_t recv_lo = j->in_place ? j->lo : 0;
  return backend_reduce_part(dev, "test reduce_part", j->send[d], j->lo, j->count, j->chunk, recv,
                             recv_lo, j->op, &j->taken[d]);
}

static void one(pmap_ctx *ctx, job *j) {
  int n = j->n;
  const float sentinel = -999.0f;
  for (int d = 0; d < n; d++)
    for (size_t i = 0; i < CAP; i++) {
      j->send[d][i] = i < j->count ? value(d, j->lo + i) : sentinel;
      j->recv[d][i] = sentinel;
    }
  char what[160];
  snprintf(what, sizeof what, "N=%d chunk %zu piece [%zu, %zu) op %d%s", n, j->chunk, j->lo,
           j->lo + j->count, (int)j->op, j->in_place ? " in place" : "");
  CHECK_OK(pmap_run(ctx, reduce_job, j));
  for (int d = 0; d < n; d++) {
    CHECK(j->taken[d], "%s: the CPU reduces the piece itself", what);
    size_t a = (size_t)d * j->chunk, b = a + j->chunk;
    long bad = 0;
    for (size_t i = 0; i < CAP; i++) {
      size_t flat = j->in_place ? j->lo + i : i; /* recv's element i: the layout's recv_lo + i */
      int mine = flat >= a && flat < b && flat >= j->lo && flat < j->lo + j->count;
      float want = j->in_place ? (i < j->count ? value(d, flat) : sentinel) : sentinel;
      if (mine) {
        float acc = value(0, flat);
        for (int k = 1; k < n; k++) {
          float v = value(k, flat);
          acc = j->op == PMAP_RED_MAX ? (v > acc ? v : acc) : acc + v;
        }
        want = j->op == PMAP_RED_MEAN ? acc / (float)n : acc;
      }
      const float *got = j->in_place ? j->send[d] : j->recv[d];
      bad += memcmp(&got[i], &want, sizeof want) != 0;
      /* The send is the caller's: unchanged outside this device's own elements in place. */
      if (!j->in_place) bad += j->send[d][i] != (i < j->count ? value(d, j->lo + i) : sentinel);
    }
    CHECK(bad == 0, "%s: device %d has %ld wrong elements", what, d, bad);
  }
}

int main(void) {
  static job j;
  for (int n = 1; n <= MAX_N; n++) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n};
    pmap_ctx *ctx = NULL;
    CHECK_OK(pmap_ctx_create(&cfg, &ctx));
    if (!ctx) continue;
    for (size_t chunk = 16; chunk <= 48; chunk += 32) {
      size_t total = chunk * (size_t)n;
      /* Pieces: empty, inside part 0, across every part, the last elements, straddling each
       * boundary between two parts, and a tail from an offset that is not a part's start. */
      size_t pieces[][2] = {{0, 0},         {3, 5},
                            {0, total},     {total - 7, 7},
                            {chunk - 3, 6}, {total / 2 + 1, total / 2 - 1},
                            {chunk, chunk}, {total - chunk - 5, chunk + 5}};
      for (size_t k = 0; k < sizeof pieces / sizeof *pieces; k++) {
        if (pieces[k][0] + pieces[k][1] > total || pieces[k][1] > CAP) continue;
        for (int op = PMAP_RED_SUM; op <= PMAP_RED_MAX; op++)
          for (int in_place = 0; in_place < 2; in_place++) {
            j.n = n;
            j.chunk = chunk;
            j.lo = pieces[k][0];
            j.count = pieces[k][1];
            j.op = (pmap_redop)op;
            j.in_place = in_place;
            one(ctx, &j);
          }
      }
    }
    CHECK_OK(pmap_ctx_destroy(ctx));
  }
  return test_exit("reduce-part");
}
