/* conv_measure.c: one convolution call on a given path (conv.h: oneDNN's primitives or im2col),
 * and the short measurement of both paths on a few of a call's rows that conv_choice.c makes at
 * a shape's first call: single-threaded as on a device thread, the outputs in scratch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "conv.h"
#include "gemm.h"

pmap_status conv_run(op_queue *q, const conv_call *c, conv_path path, conv_path *ran) {
  int done = 0;
  if (path == CONV_ONEDNN && !c->backward)
    PMAP_TRY(conv_dnnl_forward(q, c->s, c->bd, c->x, c->w, c->b, c->relu, c->y, &done));
  else if (path == CONV_ONEDNN)
    PMAP_TRY(
        conv_dnnl_backward(q, c->s, c->bd, c->x, c->w, c->ry, c->dy, c->dx, c->dw, c->db, &done));
  *ran = done ? CONV_ONEDNN : CONV_IM2COL;
  if (done) return PMAP_SUCCESS;
  if (!c->backward)
    return conv_im2col_forward(q, c->s, c->bd, c->x, c->w, c->b, c->relu, c->y, c->col);
  return conv_im2col_backward(q, c->s, c->bd, c->x, c->w, c->ry, c->dy, c->dx, c->dw, c->db, c->col,
                              c->dcol);
}

/* ------------------------------------------------------------------------------------------ */
/* The measurement                                                                            */

/* Alternating rounds after the warm-up; a timing repeats its call to take MIN_TIMING_S at
 * least (up to MAX_REPS calls), so that a small shape's time is not the clock's grain. */
#define ROUNDS 3
#define MIN_TIMING_S 1e-4
#define MAX_REPS 64
/* Past this much CPU time, no further round: a shape whose calls take milliseconds is measured
 * in two timings of each path (the difference that matters there is larger than a timing's
 * noise). */
#define BUDGET_S 0.005
/* A path this many times slower than the other after two rounds is not timed further: the choice
 * is clear, and the measurement stays within a few of the faster path's calls. */
#define DROP_FACTOR 4.0

/* The calling thread's CPU time: the measurement runs both paths on this thread alone (oneDNN
 * and the GEMM pinned to one thread), and its CPU time leaves out what the wall clock adds when
 * other processes hold the cores (a shared machine, the other devices), which is no property of
 * either path. */
static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The next buffer of `floats` in the scratch at *at, placed as cpu_alloc places device memory (16
 * bytes past a cache line, see runtime/cpu/cpu_backend.c: oneDNN's speed depends on it). */
static float *carve(char **at, size_t floats) {
  float *p = (float *)(*at + 16);
  *at += (16 + floats * sizeof(float) + 63) / 64 * 64;
  return p;
}

/* m = c on its first `rows` rows, its outputs in one allocation, *raw (zeroed, so that the sums
 * the backward adds into dw and db stay finite over the repeats). -1 without memory. */
static int scratch_call(const conv_call *c, int64_t rows, conv_call *m, void **raw) {
  const pmap_conv_shape *s = c->s;
  size_t ny = (size_t)(rows * s->oc * s->oh * s->ow), nx = (size_t)(rows * s->c * s->h * s->w);
  size_t nw = (size_t)(s->oc * s->c * s->kh * s->kw), nb = (size_t)s->oc;
  size_t need[4] = {c->backward ? 0 : ny, c->dx ? nx : 0, c->backward ? nw : 0, c->db ? nb : 0};
  size_t bytes = 0;
  for (int i = 0; i < 4; i++) bytes += (16 + need[i] * sizeof(float) + 63) / 64 * 64;
  *raw = aligned_alloc(64, bytes);
  if (!*raw) return -1;
  memset(*raw, 0, bytes);
  char *at = *raw;
  *m = *c;
  m->bd = rows;
  if (!c->backward) {
    m->y = carve(&at, need[0]);
    return 0;
  }
  m->dx = c->dx ? carve(&at, need[1]) : NULL;
  m->dw = carve(&at, need[2]);
  m->db = c->db ? carve(&at, need[3]) : NULL;
  return 0;
}

/* The time of one call of m on path, over reps calls. */
static pmap_status time_path(op_queue *q, const conv_call *m, conv_path path, int reps, double *t) {
  conv_path ran = path;
  double t0 = now_s();
  for (int r = 0; r < reps; r++) PMAP_TRY(conv_run(q, m, path, &ran));
  *t = (now_s() - t0) / reps;
  return PMAP_SUCCESS;
}

/* The calls a timing repeats, from the best time so far (one while there is none). */
static int reps_for(double t) {
  double n = t > 0.0 ? ceil(MIN_TIMING_S / t) : MAX_REPS;
  return n < 1.0 ? 1 : n > MAX_REPS ? MAX_REPS : (int)n;
}

/* The rounds: a warm-up call of each path (oneDNN makes its primitives, both touch their
 * memory), then ROUNDS rounds, each starting with the other path than the last. The best time
 * of each: what a neighbour's load adds to a timing is never negative. */
static pmap_status rounds(op_queue *q, const conv_call *m, conv_timing *out) {
  double best[2] = {INFINITY, INFINITY}, t = 0.0, start = now_s();
  for (int p = 0; p < 2; p++) PMAP_TRY(time_path(q, m, (conv_path)p, 1, &t));
  for (int round = 0; round < ROUNDS; round++) {
    if (round > 1 && now_s() - start > BUDGET_S) break;
    for (int j = 0; j < 2; j++) {
      int p = (j + round) % 2;
      PMAP_TRY(time_path(q, m, (conv_path)p, reps_for(best[p]), &t));
      best[p] = fmin(best[p], t);
    }
    if (round > 0 && (best[0] > DROP_FACTOR * best[1] || best[1] > DROP_FACTOR * best[0])) break;
  }
  out->ms[0] = 1e3 * best[0];
  out->ms[1] = 1e3 * best[1];
  out->spent_ms = 1e3 * (now_s() - start);
  return PMAP_SUCCESS;
}

pmap_status conv_measure(op_queue *q, const conv_call *c, int64_t rows, conv_timing *t,
                         int *measured) {
  conv_call m;
  void *raw = NULL;
  *measured = 0;
  if (scratch_call(c, rows, &m, &raw)) return PMAP_SUCCESS;
  /* Single-threaded, as on a device thread (oneDNN's convolutions pin themselves). */
  int threads = cpu_gemm_threads_set(1);
  pmap_status st = rounds(q, &m, t);
  cpu_gemm_threads_set(threads);
  free(raw);
  *measured = st == PMAP_SUCCESS;
  return st;
}
