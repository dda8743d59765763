/* conv-choice.c: the CPU convolutions' per-shape choice of path (ops/cpu/conv_choice.c) against
 * both paths timed: for each shape of a sweep (input and output channels, kernel, stride) and
 * each pass, the time of a call on oneDNN's primitives and on im2col + GEMM, the path the choice
 * took (measured afresh: PMAP_GEMM_CACHE=0 unless --cache) and whether it is within 10 % of the
 * faster. Single-threaded, as on a device thread; medians of interleaved samples. Where oneDNN
 * runs a pass on its reference implementation (seconds a call), its time is one call on
 * --ref-rows rows scaled to the batch, marked "~". Nothing is asserted on a time; exit 1 on a
 * failed call.
 *
 *   conv-choice [--rows N] [--hw HxW] [--channels L] [--out-channels L] [--kernels L]
 *               [--strides L] [--ref-rows N] [--cache] [--wall]  (L: comma-separated integers)
 *
 * Times are the thread's CPU time unless --wall: on a shared machine the wall clock adds the
 * time other processes hold the core, which moves from one sample to the next. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops/cpu/conv.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/gemm.h"
#include "pmap.h"

#define MAX_LIST 32
#define SAMPLES 5
#define MAX_SAMPLES 15    /* a pass outside 10 % is timed again with this many before it counts */
#define MIN_SAMPLE_S 2e-3 /* a sample repeats its call to take this long at least */
#define WITHIN 1.10

typedef struct opts {
  int64_t rows, h, w, ref_rows;
  int nc, noc, nk, ns, cache;
  int c[MAX_LIST], oc[MAX_LIST], k[MAX_LIST], s[MAX_LIST];
} opts;

/* One shape's operands (random in [-1, 1)) and outputs. */
typedef struct operands {
  float *x, *w, *b, *y, *dy, *dx, *dw, *db, *col, *dcol;
} operands;

#define MAX_MEASURED 8192
typedef struct summary {
  int passes, within, measured;
  double worst;
  char worst_what[96];
  double spent[MAX_MEASURED]; /* each measurement's CPU time, ms */
} summary;

/* The thread's CPU time (every call runs on this thread alone), or with --wall the wall clock,
 * which adds whatever other processes take of the core. */
static clockid_t clock_id = CLOCK_THREAD_CPUTIME_ID;

static double now_s(void) {
  struct timespec t;
  clock_gettime(clock_id, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int parse_list(const char *text, int *out) {
  int n = 0;
  for (const char *p = text; *p && n < MAX_LIST; n++) {
    char *end = NULL;
    long v = strtol(p, &end, 10);
    if (end == p || v < 1 || v > 4096 || (*end && *end != ',')) return -1;
    out[n] = (int)v;
    p = *end ? end + 1 : end;
  }
  return n;
}

static int parse(int argc, char **argv, opts *o) {
  static const char *const all = "1,2,3,4,5,8,12,16,17,24,32,48,64";
  *o = (opts){.rows = 16, .h = 40, .w = 44, .ref_rows = 1};
  o->nc = parse_list(all, o->c), o->noc = parse_list(all, o->oc);
  o->nk = parse_list("1,3,5", o->k), o->ns = parse_list("1,2", o->s);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long h = 0, w = 0;
    if (!strcmp(a, "--cache") || !strcmp(a, "--wall")) {
      if (a[2] == 'c')
        o->cache = 1;
      else
        clock_id = CLOCK_MONOTONIC;
      continue;
    }
    if (!v) return -1;
    i++;
    if (!strcmp(a, "--rows"))
      o->rows = atoll(v);
    else if (!strcmp(a, "--ref-rows"))
      o->ref_rows = atoll(v);
    else if (!strcmp(a, "--hw") && sscanf(v, "%lldx%lld", &h, &w) == 2)
      o->h = h, o->w = w;
    else if (!strcmp(a, "--channels"))
      o->nc = parse_list(v, o->c);
    else if (!strcmp(a, "--out-channels"))
      o->noc = parse_list(v, o->oc);
    else if (!strcmp(a, "--kernels"))
      o->nk = parse_list(v, o->k);
    else if (!strcmp(a, "--strides"))
      o->ns = parse_list(v, o->s);
    else
      return -1;
  }
  int ok = o->rows >= 1 && o->h >= 1 && o->w >= 1 && o->ref_rows >= 1 && o->ref_rows <= o->rows;
  return ok && o->nc > 0 && o->noc > 0 && o->nk > 0 && o->ns > 0 ? 0 : -1;
}

static float *filled(size_t n) {
  static uint64_t rng = 7;
  float *p = malloc((n + 1) * sizeof *p);
  for (size_t i = 0; p && i < n; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = (float)(rng >> 40) / 8388608.0f - 1.0f;
  }
  return p;
}

static void operands_free(operands *d) {
  float *all[] = {d->x, d->w, d->b, d->y, d->dy, d->dx, d->dw, d->db, d->col, d->dcol};
  for (int i = 0; i < 10; i++) free(all[i]);
}

static int operands_make(const pmap_conv_shape *s, int64_t bd, operands *d) {
  size_t nx = (size_t)(bd * s->c * s->h * s->w), ny = (size_t)(bd * s->oc * s->oh * s->ow);
  size_t nw = (size_t)(s->oc * s->c * s->kh * s->kw), ncol = (size_t)(nw / s->oc * s->oh * s->ow);
  *d = (operands){filled(nx), filled(nw), filled((size_t)s->oc), filled(ny),   filled(ny),
                  filled(nx), filled(nw), filled((size_t)s->oc), filled(ncol), filled(ncol)};
  return d->x && d->w && d->b && d->y && d->dy && d->dx && d->dw && d->db && d->col && d->dcol ? 0
                                                                                               : -1;
}

/* One call of the pass on `rows` rows, on the path in use (cpu_conv_force). */
static pmap_status call(const pmap_conv_shape *s, int64_t rows, int backward, operands *d) {
  if (!backward)
    return pmap_cpu_ops.conv2d_forward(NULL, s, rows, d->x, d->w, d->b, 1, d->y, d->col);
  memset(d->dw, 0, (size_t)(s->oc * s->c * s->kh * s->kw) * sizeof *d->dw);
  memset(d->db, 0, (size_t)s->oc * sizeof *d->db);
  return pmap_cpu_ops.conv2d_backward(NULL, s, rows, d->x, d->w, d->y, d->dy, d->dx, d->dw, d->db,
                                      d->col, d->dcol);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* t[path] the median time of a call on oneDNN (0) and im2col (1) in ms, n samples interleaved;
 * ref: oneDNN runs the pass on its reference implementation, timed once on ref_rows rows and
 * scaled to the batch. -1 on a failed call. */
static int time_paths(const pmap_conv_shape *s, const opts *o, int backward, int ref, operands *d,
                      int n, double t[2]) {
  static const char *const names[] = {"onednn", "im2col"};
  double samples[2][MAX_SAMPLES];
  for (int p = ref ? 1 : 0; p < 2; p++)
    if (cpu_conv_force(names[p]) || call(s, o->rows, backward, d)) return -1; /* warm-up */
  for (int r = 0; r < n; r++)
    for (int j = 0; j < 2; j++) {
      int p = (j + r) % 2;
      if (p == 0 && ref) continue;
      int reps = 0;
      double t0 = now_s(), dt = 0.0;
      if (cpu_conv_force(names[p])) return -1;
      do {
        if (call(s, o->rows, backward, d)) return -1;
        reps++;
        dt = now_s() - t0;
      } while (dt < MIN_SAMPLE_S && reps < 1000);
      samples[p][r] = 1e3 * dt / reps;
    }
  for (int p = ref ? 1 : 0; p < 2; p++) {
    qsort(samples[p], (size_t)n, sizeof samples[p][0], cmp_double);
    t[p] = samples[p][n / 2];
  }
  if (ref && !isfinite(t[0])) {
    double t0 = now_s();
    if (cpu_conv_force("onednn") || call(s, o->ref_rows, backward, d)) return -1;
    t[0] = 1e3 * (now_s() - t0) * (double)o->rows / (double)o->ref_rows;
  }
  return 0;
}

/* The choice for the pass, made at its first call now: its path, reason and the CPU time its
 * measurement took (0 where none was made). */
static int choose(const pmap_conv_shape *s, const opts *o, int backward, operands *d, int *path,
                  const char **reason, double *spent_ms) {
  if (cpu_conv_force("auto") || call(s, o->rows, backward, d)) return -1;
  conv_call c = {.s = s,
                 .bd = o->rows,
                 .backward = backward,
                 .b = d->b,
                 .relu = 1,
                 .ry = d->y,
                 .dx = d->dx,
                 .db = d->db};
  *path = conv_choice_find(&c, reason, spent_ms);
  return *path < 0 ? -1 : 0;
}

static int run_shape(const pmap_conv_shape *s, const opts *o, summary *sum) {
  operands d;
  int kinds = 0, rc = 0;
  if (operands_make(s, o->rows, &d) || conv_dnnl_kinds(NULL, s, o->rows, 1, &kinds)) rc = -1;
  for (int backward = 0; backward < 2 && !rc; backward++) {
    int ref = backward ? (kinds & (CONV_DNNL_REF_DATA | CONV_DNNL_REF_WEIGHTS)) != 0
                       : (kinds & CONV_DNNL_REF_FORWARD) != 0;
    int path = -1;
    const char *reason = "";
    double t[2] = {INFINITY, INFINITY}, spent = 0.0;
    int n = SAMPLES;
    if (choose(s, o, backward, &d, &path, &reason, &spent) ||
        time_paths(s, o, backward, ref && kinds, &d, n, t)) {
      rc = -1;
      break;
    }
    if (!kinds) t[0] = t[1]; /* oneDNN does not serve it: its path is im2col's */
    if (t[path] > WITHIN * fmin(t[0], t[1])) {
      n = MAX_SAMPLES; /* a neighbour's load, or a miss: timed again before it counts */
      if (time_paths(s, o, backward, ref && kinds, &d, n, t)) {
        rc = -1;
        break;
      }
      if (!kinds) t[0] = t[1];
    }
    double fastest = fmin(t[0], t[1]), ratio = t[path] / fastest;
    int ok = ratio <= WITHIN;
    char what[96];
    snprintf(what, sizeof what, "%s c%lld oc%lld k%d s%d", backward ? "backward" : "forward",
             (long long)s->c, (long long)s->oc, s->kh, s->stride);
    const char *mark = !kinds ? "=" : ref ? "~" : " ";
    printf("%-8s %3lld %3lld %2d %2d %11.4f%s %10.4f  %-6s %6.3f  %-3s %2d %8.2f  %s\n",
           backward ? "backward" : "forward", (long long)s->c, (long long)s->oc, s->kh, s->stride,
           t[0], mark, t[1], path ? "im2col" : "onednn", ratio, ok ? "yes" : "NO", n, spent,
           reason);
    fflush(stdout);
    sum->passes++;
    sum->within += ok;
    if (spent > 0.0 && sum->measured < MAX_MEASURED) sum->spent[sum->measured++] = spent;
    if (ratio > sum->worst) sum->worst = ratio, snprintf(sum->worst_what, 96, "%s", what);
  }
  operands_free(&d);
  return rc;
}

/* /proc/loadavg's first three fields and a newline, for a person reading the results. */
static const char *load_average(void) {
  static char text[64] = "unknown\n";
  FILE *f = fopen("/proc/loadavg", "r");
  double a[3];
  if (f && fscanf(f, "%lf %lf %lf", &a[0], &a[1], &a[2]) == 3)
    snprintf(text, sizeof text, "%.2f %.2f %.2f\n", a[0], a[1], a[2]);
  if (f) fclose(f);
  return text;
}

static void header(const opts *o) {
  char model[256] = "unknown";
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
      snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
      model[strcspn(model, "\n")] = '\0';
      break;
    }
  if (f) fclose(f);
  printf(
      "# conv-choice: %s; pmap_cpu_isa %s; GEMM %s (%s); %lld rows of (C, %lld, %lld), pad "
      "k/2, bias and ReLU, input gradient; choice %s\n",
      model, pmap_cpu_isa(), pmap_gemm_provider(), pmap_gemm_reason(), (long long)o->rows,
      (long long)o->h, (long long)o->w, o->cache ? "from the cache" : "measured afresh");
  printf("# load average %s", load_average());
  printf(
      "# ms per call (%s), median of n interleaved samples (%d, or %d again for a pass outside 10 "
      "%%); "
      "onednn ~: reference implementation, one call on %lld rows scaled; =: oneDNN does not "
      "serve the shape (im2col's time); measure_ms: the CPU time of the choice's measurement "
      "(0: none)\n",
      clock_id == CLOCK_MONOTONIC ? "wall clock" : "the thread's CPU time", SAMPLES, MAX_SAMPLES,
      (long long)o->ref_rows);
  printf(
      "# pass     c  oc  k  s   onednn_ms  im2col_ms  chosen  ratio  ok   n measure_ms  reason\n");
}

/* The last lines: how many passes chose within 10 % of the faster, the worst, and what the
 * choice's measurements cost. */
static void report(summary *sum) {
  printf("# passes %d; chosen within 10 %% of the faster: %d; worst chosen/faster %.3f (%s)\n",
         sum->passes, sum->within, sum->worst, sum->worst_what);
  printf("# load average %s", load_average());
  int m = sum->measured;
  double all = 0.0;
  for (int i = 0; i < m; i++) all += sum->spent[i];
  qsort(sum->spent, (size_t)m, sizeof sum->spent[0], cmp_double);
  printf(
      "# measured %d passes: the choice's measurements took %.1f ms of CPU time in all, median "
      "%.2f ms, 90th percentile %.2f ms, at most %.2f ms\n",
      m, all, m ? sum->spent[m / 2] : 0.0, m ? sum->spent[m * 9 / 10] : 0.0,
      m ? sum->spent[m - 1] : 0.0);
}

int main(int argc, char **argv) {
  opts o;
  if (parse(argc, argv, &o)) {
    fprintf(stderr,
            "usage: conv-choice [--rows N] [--hw HxW] [--channels L] [--out-channels L] "
            "[--kernels L] [--strides L] [--ref-rows N] [--cache] [--wall]\n");
    return 2;
  }
  if (!o.cache) setenv("PMAP_GEMM_CACHE", "0", 1);
  cpu_gemm_threads_set(1); /* as on a device thread */
  setvbuf(stdout, NULL, _IOLBF, 0);
  header(&o);
  static summary sum; /* large: every measurement's time */
  for (int ci = 0; ci < o.nc; ci++)
    for (int oi = 0; oi < o.noc; oi++)
      for (int ki = 0; ki < o.nk; ki++)
        for (int si = 0; si < o.ns; si++) {
          int k = o.k[ki], st = o.s[si], pad = k / 2;
          pmap_conv_shape s = {o.c[ci],
                               o.h,
                               o.w,
                               o.oc[oi],
                               (o.h + 2 * pad - k) / st + 1,
                               (o.w + 2 * pad - k) / st + 1,
                               k,
                               k,
                               st,
                               pad};
          if (run_shape(&s, &o, &sum)) {
            fprintf(stderr, "conv-choice: c %d oc %d k %d s %d: %s\n", o.c[ci], o.oc[oi], k, st,
                    pmap_last_error());
            return 1;
          }
        }
  report(&sum);
  return 0;
}
