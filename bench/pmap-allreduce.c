/* pmap-allreduce: all-reduce bandwidth of pmap's collectives in the layout of nccl-tests'
 * all_reduce_perf: per size the median time, algorithm and bus bandwidth and the count of wrong
 * values, out of place and in place, then a single-thread memcpy for scale. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "pmap.h"

static const char *prog = "pmap-allreduce";

#define CHUNK ((size_t)1 << 18) /* floats staged per upload or download when filling, checking */

typedef enum redop { OP_SUM, OP_MEAN, OP_MAX, OP_COUNT } redop;
static const char *const op_name[OP_COUNT] = {"sum", "mean", "max"};

/* Device d's input: small integers, so that every sum over up to 64 devices is exact. */
static float pattern(int d, size_t i) {
  return (float)((int)((i * 37u + (size_t)d * 101u) % 61u) - 30);
}

static float expected(redop op, int n, size_t i) {
  float acc = pattern(0, i);
  for (int d = 1; d < n; d++) acc = op == OP_MAX ? fmaxf(acc, pattern(d, i)) : acc + pattern(d, i);
  return op == OP_MEAN ? acc / (float)n : acc;
}

typedef struct bench {
  int n; /* global devices: every process's */
  size_t max_count;
  float **send, **recv, **host; /* (n) device buffers and a host chunk per device */
  /* The current job. */
  int setup, teardown;
  redop op;
  size_t count;
  int iters, warmup, check;
  double *t[2];      /* (iters) per call, out of place and in place, seconds */
  int64_t *wrong[2]; /* (n) wrong values per device */
} bench;

static pmap_status coll(pmap_device *dev, redop op, const float *s, float *r, size_t count) {
  if (op == OP_SUM) return pmap_psum(dev, s, r, count);
  if (op == OP_MEAN) return pmap_pmean(dev, s, r, count);
  return pmap_pmax(dev, s, r, count);
}

static pmap_status fill(pmap_device *dev, bench *b, float *dst) {
  int d = pmap_local_index(dev), g = pmap_axis_index(dev);
  for (size_t lo = 0; lo < b->count; lo += CHUNK) {
    size_t len = b->count - lo < CHUNK ? b->count - lo : CHUNK;
    for (size_t i = 0; i < len; i++) b->host[d][i] = pattern(g, lo + i);
    pmap_status st = pmap_device_upload(dev, dst + lo, b->host[d], len);
    if (st) return st;
  }
  return PMAP_SUCCESS;
}

static pmap_status count_wrong(pmap_device *dev, bench *b, const float *src, int64_t *wrong) {
  int d = pmap_local_index(dev); /* per-process arrays */
  *wrong = 0;
  for (size_t lo = 0; lo < b->count; lo += CHUNK) {
    size_t len = b->count - lo < CHUNK ? b->count - lo : CHUNK;
    pmap_status st = pmap_device_download(dev, b->host[d], src + lo, len);
    if (st) return st;
    for (size_t i = 0; i < len; i++) {
      float want = expected(b->op, b->n, lo + i), got = b->host[d][i];
      /* Sums and maxima of the pattern are exact. A mean may be formed as a sum scaled by 1/n
       * (NCCL's ncclAvg), which rounds differently from a sum divided by n: one part in 1e6. */
      int ok =
          b->op == OP_MEAN ? fabsf(got - want) <= 1e-6f * fmaxf(1.0f, fabsf(want)) : got == want;
      *wrong += !ok;
    }
  }
  return PMAP_SUCCESS;
}

static pmap_status job(pmap_device *dev, void *arg) {
  bench *b = arg;
  int d = pmap_local_index(dev); /* per-process arrays */
  pmap_status st = PMAP_SUCCESS;
  if (b->setup) {
    b->host[d] = malloc(CHUNK * sizeof(float));
    if (!b->host[d]) return PMAP_ERR_OUT_OF_MEMORY;
    if ((st = pmap_device_alloc(dev, b->max_count, &b->send[d]))) return st;
    return pmap_device_alloc(dev, b->max_count, &b->recv[d]);
  }
  if (b->teardown) {
    pmap_device_free(dev, b->send[d]);
    pmap_device_free(dev, b->recv[d]);
    free(b->host[d]);
    return PMAP_SUCCESS;
  }
  float sink = 0.0f;
  for (int place = 0; place < 2; place++) { /* 0 out of place, 1 in place */
    float *send = b->send[d], *recv = place ? send : b->recv[d];
    if ((st = fill(dev, b, send))) return st;
    for (int i = 0; i < b->warmup; i++)
      if ((st = coll(dev, b->op, send, recv, b->count))) return st;
    if ((st = pmap_barrier(dev))) return st;
    for (int i = 0; i < b->iters; i++) {
      double t0 = cli_now();
      if ((st = coll(dev, b->op, send, recv, b->count))) return st;
      /* A one-value download waits for the device's queued work (CUDA); on CPU it is a copy. */
      if ((st = pmap_device_download(dev, &sink, recv, 1))) return st;
      if (d == 0) b->t[place][i] = cli_now() - t0;
    }
    b->wrong[place][d] = 0;
    if (!b->check) continue;
    if ((st = fill(dev, b, send))) return st;
    if ((st = coll(dev, b->op, send, recv, b->count))) return st;
    if ((st = count_wrong(dev, b, recv, &b->wrong[place][d]))) return st;
  }
  return PMAP_SUCCESS;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Single-thread memcpy bandwidth (bytes copied / time), median of `iters` after a warm copy. */
static double memcpy_gbs(size_t bytes, int iters) {
  char *a = malloc(bytes), *c = malloc(bytes);
  double *t = malloc(sizeof *t * (size_t)iters), gbs = 0.0;
  if (a && c && t) {
    memset(a, 1, bytes);
    memcpy(c, a, bytes);
    for (int i = 0; i < iters; i++) {
      double t0 = cli_now();
      memcpy(c, a, bytes);
      t[i] = cli_now() - t0;
      a[(size_t)i % bytes] = c[bytes - 1]; /* keep the copies observable */
    }
    gbs = (double)bytes / median(t, iters) / 1e9;
  }
  free(a);
  free(c);
  free(t);
  return gbs;
}

typedef struct opts {
  int64_t minb, maxb, factor, iters, warmup, check, copy_bytes;
  int64_t devs[CLI_MAX_LIST];
  int ndev, json, ops[OP_COUNT];
  const char *backend, *csv;
} opts;

/* The options (tools/cli.h), read into *o after its defaults: 0, 1 after --help, -1 on an
 * error (printed). */
static int parse(int argc, char **argv, opts *o) {
  static const char *const ops[] = {"sum", "mean", "max", "all", NULL};
  int op = OP_SUM;
  *o = (opts){8, 128 << 20, 2, 20, 5, 1, 16 << 20, {2}, 1, 0, {0, 0, 0}, "auto", NULL};
  const int64_t four_g = INT64_C(1) << 32;
  const cli_option table[] = {
      {.name = "-b",
       .kind = CLI_BYTES,
       .dest = &o->minb,
       .lo = 4,
       .hi = four_g,
       .arg = "MINBYTES",
       .help = "the smallest size (default 8; K, M and G suffixes are powers of 1024)"},
      {.name = "-e",
       .kind = CLI_BYTES,
       .dest = &o->maxb,
       .lo = 4,
       .hi = four_g,
       .arg = "MAXBYTES",
       .help = "the largest size (default 128M)"},
      {.name = "-f",
       .kind = CLI_INT,
       .dest = &o->factor,
       .lo = 2,
       .hi = 1024,
       .arg = "FACTOR",
       .help = "sizes from MINBYTES to MAXBYTES, times FACTOR each step (default 2)"},
      {.name = "-d",
       .kind = CLI_LIST,
       .dest = o->devs,
       .count = &o->ndev,
       .lo = 1,
       .hi = PMAP_MAX_DEVICES,
       .arg = "DEVICES[,...]",
       .help = "device counts (default 2), one table each"},
      {.name = "-n",
       .kind = CLI_INT,
       .dest = &o->iters,
       .lo = 1,
       .hi = 100000,
       .arg = "ITERS",
       .help = "timed iterations per size (default 20)"},
      {.name = "-w",
       .kind = CLI_INT,
       .dest = &o->warmup,
       .lo = 0,
       .hi = 100000,
       .arg = "WARMUP",
       .help = "warm-up iterations per size (default 5)"},
      {.name = "-o",
       .kind = CLI_CHOICE,
       .dest = &op,
       .choices = ops,
       .help = "reduction: pmap_psum, pmap_pmean, pmap_pmax, or all three (default sum)"},
      {.name = "-c",
       .kind = CLI_INT,
       .dest = &o->check,
       .lo = 0,
       .hi = 1,
       .arg = "0|1",
       .help = "check every value of a separate run against the exact result (default 1)"},
      {.name = "--backend",
       .kind = CLI_STRING,
       .dest = &o->backend,
       .arg = "auto|cpu|cuda",
       .help = "the backend (default auto)"},
      {.name = "--copy-bytes",
       .kind = CLI_BYTES,
       .dest = &o->copy_bytes,
       .lo = 4,
       .hi = four_g,
       .arg = "BYTES",
       .help = "single-thread memcpy measured for scale (default 16M)"},
      {.name = "--csv",
       .kind = CLI_STRING,
       .dest = &o->csv,
       .arg = "FILE",
       .help = "also write the rows as CSV"},
      {.name = "--json",
       .kind = CLI_FLAG,
       .dest = &o->json,
       .flag = 1,
       .help = "end with one line of JSON"},
  };
  const cli_spec spec = {
      prog, table, (int)(sizeof table / sizeof table[0]),
      "All-reduce bandwidth of pmap's collectives in the layout of nccl-tests' all_reduce_perf.",
      "time is the median per call in microseconds; algbw = bytes / time; busbw = algbw * "
      "2(n-1)/n, the bandwidth each device's link needs in a ring. Exit status 1 on any wrong "
      "value."};
  int r = cli_parse(&spec, argc, argv);
  if (r) return r;
  for (int k = 0; k < OP_COUNT; k++) o->ops[k] = op == OP_COUNT || op == k;
  if (o->maxb < o->minb)
    return cli_error(prog, "-e %lld is below -b %lld", (long long)o->maxb, (long long)o->minb);
  return 0;
}

/* One table: every size and reduction on n devices. Appends JSON rows to js (may be NULL). */
static int run_devices(const opts *o, pmap_backend backend, int n, FILE *csv, FILE *js,
                       int *first_row, int64_t *wrong_total, double copy_gbs, const char **bname) {
  pmap_config cfg = {.backend = backend, .num_devices = n};
  pmap_ctx *ctx = NULL;
  bench b = {0};
  int code = 0;
  b.n = n;
  b.max_count = (size_t)(o->maxb / 4);
  b.iters = (int)o->iters;
  b.warmup = (int)o->warmup;
  b.check = (int)o->check;
  b.send = calloc((size_t)n, sizeof *b.send);
  b.recv = calloc((size_t)n, sizeof *b.recv);
  b.host = calloc((size_t)n, sizeof *b.host);
  b.t[0] = malloc(sizeof(double) * (size_t)o->iters);
  b.t[1] = malloc(sizeof(double) * (size_t)o->iters);
  b.wrong[0] = calloc((size_t)n, sizeof(int64_t));
  b.wrong[1] = calloc((size_t)n, sizeof(int64_t));
  if (!b.send || !b.recv || !b.host || !b.t[0] || !b.t[1] || !b.wrong[0] || !b.wrong[1]) {
    fprintf(stderr, "%s: out of memory\n", prog);
    code = 1;
    goto out;
  }
  if (pmap_ctx_create(&cfg, &ctx)) {
    fprintf(stderr, "%s: cannot create %d devices: %s\n", prog, n, pmap_last_error());
    code = 1;
    goto out;
  }
  *bname = pmap_backend_name(pmap_ctx_backend(ctx));
  /* Under mpirun --devices is per process: the table is over every process's devices, and its
   * all-reduce is the hierarchical one (local, inter-process, local). */
  int procs = pmap_ctx_num_processes(ctx), g = n * procs;
  b.n = g;
  b.setup = 1;
  if (pmap_run(ctx, job, &b)) {
    fprintf(stderr, "%s: cannot allocate 2 x %lld bytes per device: %s\n", prog, (long long)o->maxb,
            pmap_last_error());
    b.setup = 0;
    code = 1;
    goto out;
  }
  b.setup = 0;
  double busbw_sum = 0.0, copy_share[2] = {-1.0, -1.0};
  int rows = 0;
  if (procs > 1)
    printf("#\n# %d devices: %d processes x %d (%s backend)\n#\n", g, procs, n, *bname);
  else
    printf("#\n# %d devices (%s backend)\n#\n", n, *bname);
  printf("# %64s %31s\n", "out-of-place", "in-place");
  printf("# %10s %12s %8s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type", "redop",
         "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("# %10s %12s %8s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "",
         "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  for (int64_t bytes = o->minb; bytes <= o->maxb && !code; bytes *= o->factor) {
    b.count = (size_t)(bytes / 4);
    for (int k = 0; k < OP_COUNT && !code; k++) {
      if (!o->ops[k]) continue;
      b.op = (redop)k;
      if (pmap_run(ctx, job, &b)) {
        fprintf(stderr, "%s: %s of %lld bytes on %d devices: %s\n", prog, op_name[k],
                (long long)bytes, n, pmap_last_error());
        code = 1;
        break;
      }
      double us[2], alg[2], bus[2];
      int64_t wrong[2] = {0, 0};
      for (int p = 0; p < 2; p++) {
        us[p] = 1e6 * median(b.t[p], b.iters);
        alg[p] = (double)(b.count * 4) / (us[p] * 1e-6) / 1e9;
        bus[p] = alg[p] * 2.0 * (g - 1) / g;
        for (int d = 0; d < n; d++) wrong[p] += b.wrong[p][d];
        *wrong_total += wrong[p];
        busbw_sum += bus[p];
        if (bytes == o->copy_bytes && k == OP_SUM && copy_gbs > 0.0)
          copy_share[p] = bus[p] / copy_gbs;
      }
      rows += 2;
      printf("  %10lld %12zu %8s %6s %8.2f %7.2f %7.2f %6lld %8.2f %7.2f %7.2f %6lld\n",
             (long long)(b.count * 4), b.count, "float", op_name[k], us[0], alg[0], bus[0],
             (long long)wrong[0], us[1], alg[1], bus[1], (long long)wrong[1]);
      if (csv)
        fprintf(csv, "%d,%s,%lld,%zu,float,%s,%.6g,%.6g,%.6g,%lld,%.6g,%.6g,%.6g,%lld\n", g, *bname,
                (long long)(b.count * 4), b.count, op_name[k], us[0], alg[0], bus[0],
                (long long)wrong[0], us[1], alg[1], bus[1], (long long)wrong[1]);
      if (js) {
        fprintf(js,
                "%s{\"devices\": %d, \"bytes\": %lld, \"count\": %zu, \"type\": \"float\", "
                "\"redop\": \"%s\", \"oop_time_us\": %.6g, \"oop_algbw\": %.6g, "
                "\"oop_busbw\": %.6g, \"oop_wrong\": %lld, \"ip_time_us\": %.6g, "
                "\"ip_algbw\": %.6g, \"ip_busbw\": %.6g, \"ip_wrong\": %lld}",
                *first_row ? "" : ", ", g, (long long)(b.count * 4), b.count, op_name[k], us[0],
                alg[0], bus[0], (long long)wrong[0], us[1], alg[1], bus[1], (long long)wrong[1]);
        *first_row = 0;
      }
    }
  }
  if (!code) {
    printf("# Out of bounds values : %lld %s\n", (long long)*wrong_total,
           *wrong_total ? "WRONG" : "OK");
    printf("# Avg bus bandwidth    : %g\n", rows ? busbw_sum / rows : 0.0);
    if (copy_share[0] >= 0.0)
      printf(
          "# all-reduce (sum) of %lld bytes: busbw %.0f%% (out of place), %.0f%% (in place) of "
          "the 1-thread memcpy bandwidth\n",
          (long long)o->copy_bytes, 100.0 * copy_share[0], 100.0 * copy_share[1]);
  }
out:
  if (ctx && b.send && b.send[0]) {
    b.teardown = 1;
    pmap_run(ctx, job, &b);
  }
  pmap_ctx_destroy(ctx);
  free(b.send);
  free(b.recv);
  free(b.host);
  free(b.t[0]);
  free(b.t[1]);
  free(b.wrong[0]);
  free(b.wrong[1]);
  return code;
}

int main(int argc, char **argv) {
  opts o;
  pmap_backend backend;
  int parsed = parse(argc, argv, &o);
  if (parsed) return parsed < 0;
  if (pmap_backend_parse(o.backend, &backend)) {
    fprintf(stderr, "%s: --backend: %s\n", prog, cli_lib_reason(pmap_last_error()));
    return 1;
  }
  /* Under mpirun every process measures, process 0 alone reports and writes files. */
  pmap_config probe_cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
  pmap_ctx *probe = NULL;
  if (pmap_ctx_create(&probe_cfg, &probe)) {
    fprintf(stderr, "%s: cannot create the context: %s\n", prog, pmap_last_error());
    return 1;
  }
  int me = pmap_ctx_process_index(probe);
  pmap_ctx_destroy(probe);
  if (me != 0) {
    o.csv = NULL;
    if (!freopen("/dev/null", "w", stdout)) return 1;
  }
  FILE *csv = NULL, *js = NULL;
  char *jbuf = NULL;
  size_t jlen = 0;
  if (o.csv && !(csv = fopen(o.csv, "w"))) {
    fprintf(stderr, "%s: --csv: cannot write %s\n", prog, o.csv);
    return 1;
  }
  if (csv)
    fprintf(csv,
            "devices,backend,bytes,count,type,redop,oop_time_us,oop_algbw,oop_busbw,"
            "oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong\n");
  if (o.json && !(js = open_memstream(&jbuf, &jlen))) {
    fprintf(stderr, "%s: out of memory\n", prog);
    return 1;
  }
  double copy = memcpy_gbs((size_t)o.copy_bytes, 20);
  printf(
      "# pmap-allreduce: %lld to %lld bytes, factor %lld, %lld iterations after %lld warm-up, "
      "check %s\n# memcpy, 1 thread, %lld bytes: %.2f GB/s\n",
      (long long)o.minb, (long long)o.maxb, (long long)o.factor, (long long)o.iters,
      (long long)o.warmup, o.check ? "on" : "off", (long long)o.copy_bytes, copy);
  int64_t wrong = 0;
  int first = 1, code = 0;
  const char *bname = "?";
  for (int i = 0; i < o.ndev && !code; i++) {
    int64_t w = 0;
    code = run_devices(&o, backend, (int)o.devs[i], csv, js, &first, &w, copy, &bname);
    wrong += w;
  }
  if (csv && fclose(csv)) {
    fprintf(stderr, "%s: --csv: cannot write %s\n", prog, o.csv);
    code = 1;
  }
  if (js) {
    fclose(js);
    if (!code)
      printf(
          "{\"backend\": \"%s\", \"memcpy_bytes\": %lld, \"memcpy_gbs\": %.6g, \"iters\": %lld, "
          "\"warmup\": %lld, \"wrong\": %lld, \"rows\": [%s]}\n",
          bname, (long long)o.copy_bytes, copy, (long long)o.iters, (long long)o.warmup,
          (long long)wrong, jbuf ? jbuf : "");
    free(jbuf);
  }
  if (wrong) fprintf(stderr, "%s: %lld wrong values\n", prog, (long long)wrong);
  return code || wrong ? 1 : 0;
}
