/* train_text.c: pmap-train's byte-level text data, its held-out loss and sampling
 * (train_text.h). Windows and samples come from a small seeded generator, so a run is the same
 * for any device count. */
#include "train_text.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 256
#define MAX_TEXT ((int64_t)1 << 31)
#define EVAL_WINDOWS 256

static int fail(char *msg, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *msg, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, size, fmt, ap);
  va_end(ap);
  return -1;
}

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int text_load(const char *path, int64_t t, double eval_fraction, uint64_t seed, text_data *d,
              char *msg, size_t size) {
  memset(d, 0, sizeof *d);
  FILE *f = fopen(path, "rb");
  if (!f) return fail(msg, size, "--text: cannot open \"%s\"", path);
  int rc = 0;
  if (fseek(f, 0, SEEK_END) == 0) {
    long len = ftell(f);
    if (len < 0 || (int64_t)len > MAX_TEXT)
      rc = fail(msg, size, "--text: \"%s\" is not a regular file of at most 2 GiB", path);
    else
      d->n = len;
  } else {
    rc = fail(msg, size, "--text: cannot seek in \"%s\"", path);
  }
  if (!rc && fseek(f, 0, SEEK_SET) != 0) rc = fail(msg, size, "--text: cannot read \"%s\"", path);
  if (!rc) d->bytes = malloc((size_t)(d->n ? d->n : 1));
  if (!rc && !d->bytes)
    rc = fail(msg, size, "--text: out of memory for %lld bytes", (long long)d->n);
  if (!rc && fread(d->bytes, 1, (size_t)d->n, f) != (size_t)d->n)
    rc = fail(msg, size, "--text: cannot read \"%s\"", path);
  fclose(f);
  if (rc) {
    text_free(d);
    return rc;
  }
  int64_t held = (int64_t)ceil(eval_fraction * (double)d->n);
  if (held < t + 1) held = t + 1;
  d->train_n = d->n - held;
  d->t = t;
  d->seed = seed;
  if (d->train_n < t + 1) {
    int64_t n = d->n;
    text_free(d);
    return fail(msg, size,
                "--text: \"%s\" has %lld bytes; with --context %lld it needs at least %lld (a "
                "window to train on and one held out)",
                path, (long long)n, (long long)t, (long long)(2 * (t + 1)));
  }
  return 0;
}

void text_free(text_data *d) {
  free(d->bytes);
  free(d->xb);
  free(d->yb);
  memset(d, 0, sizeof *d);
}

static int reserve(text_data *d, int64_t rows, char *msg, size_t size) {
  if (rows <= d->cap) return 0;
  size_t n = (size_t)(rows * d->t);
  int32_t *x = realloc(d->xb, n * sizeof *x);
  if (x) d->xb = x;
  int32_t *y = realloc(d->yb, n * sizeof *y);
  if (y) d->yb = y;
  if (!x || !y) return fail(msg, size, "out of memory for %lld windows", (long long)rows);
  d->cap = rows;
  return 0;
}

/* Row r of xs and ys from the window starting at byte `at`. */
static void window(text_data *d, int64_t r, int64_t at) {
  for (int64_t j = 0; j < d->t; j++) {
    d->xb[r * d->t + j] = d->bytes[at + j];
    d->yb[r * d->t + j] = d->bytes[at + j + 1];
  }
}

int text_batch(text_data *d, int64_t step, int64_t batch, pmap_array *xs, pmap_array *ys, char *msg,
               size_t size) {
  if (reserve(d, batch, msg, size)) return -1;
  uint64_t starts = (uint64_t)(d->train_n - d->t); /* windows of t + 1 bytes */
  for (int64_t i = 0; i < batch; i++) {
    uint64_t h = mix64(d->seed ^ mix64((uint64_t)step * 0x100000001b3ull + (uint64_t)i));
    window(d, i, (int64_t)(h % starts));
  }
  *xs = (pmap_array){d->xb, PMAP_I32, 2, {batch, d->t, 0, 0}};
  *ys = (pmap_array){d->yb, PMAP_I32, 2, {batch, d->t, 0, 0}};
  return 0;
}

/* s plus the cross-entropies of rows of logits (rows, VOCAB) against targets, in row order. */
static double xent_sum(double s, const float *z, const int32_t *y, int64_t rows) {
  for (int64_t r = 0; r < rows; r++, z += VOCAB) {
    double mx = z[0], se = 0.0;
    for (int k = 1; k < VOCAB; k++) mx = z[k] > mx ? z[k] : mx;
    for (int k = 0; k < VOCAB; k++) se += exp((double)z[k] - mx);
    s += log(se) + mx - z[y[r]];
  }
  return s;
}

int text_eval(text_data *d, pmap_params *params, int devices, int64_t piece, double *loss,
              char *msg, size_t size) {
  int64_t windows = (d->n - d->train_n - 1) / d->t;
  if (windows > EVAL_WINDOWS) windows = EVAL_WINDOWS;
  if (windows < 1) return fail(msg, size, "no held-out window");
  /* At most `piece` windows a call (the training batch: the plan's rows), a multiple of the
   * device count; the last call padded with its last window. */
  int64_t chunk = piece / devices * devices;
  if (chunk < devices) chunk = devices;
  if (chunk > (windows + devices - 1) / devices * devices)
    chunk = (windows + devices - 1) / devices * devices;
  if (reserve(d, chunk, msg, size)) return -1;
  float *out = malloc((size_t)(chunk * d->t * VOCAB) * sizeof *out);
  if (!out) return fail(msg, size, "out of memory for the held-out logits");
  double sum = 0.0;
  int rc = 0;
  for (int64_t a = 0; a < windows && !rc; a += chunk) {
    int64_t n = windows - a < chunk ? windows - a : chunk;
    int64_t rows = (n + devices - 1) / devices * devices;
    for (int64_t i = 0; i < rows; i++) window(d, i, d->train_n + (a + (i < n ? i : n - 1)) * d->t);
    pmap_array xs = {d->xb, PMAP_I32, 2, {rows, d->t, 0, 0}};
    pmap_array o = {out, PMAP_F32, 3, {rows, d->t, VOCAB, 0}};
    if (pmap_predict(params, &xs, &o))
      rc = fail(msg, size, "%s", pmap_last_error());
    else
      sum = xent_sum(sum, out, d->yb, n * d->t);
  }
  if (!rc) *loss = sum / (double)(windows * d->t);
  free(out);
  return rc;
}

int text_sample(pmap_params *params, int devices, int64_t t, const unsigned char *prompt,
                int64_t plen, int64_t n, float temperature, uint64_t seed, FILE *f, char *msg,
                size_t size) {
  if (plen < 1) return fail(msg, size, "--sample: the prompt is empty");
  int64_t len = plen, cap = plen + n;
  unsigned char *text = malloc((size_t)cap);
  int32_t *x = calloc((size_t)(devices * t), sizeof *x);
  float *out = malloc((size_t)(devices * t * VOCAB) * sizeof *out);
  double *p = malloc(VOCAB * sizeof *p);
  int rc = 0;
  if (!text || !x || !out || !p) rc = fail(msg, size, "--sample: out of memory");
  if (!rc) memcpy(text, prompt, (size_t)plen);
  uint64_t s = seed;
  for (int64_t g = 0; !rc && g < n; g++) {
    /* The last t bytes at positions 0.. (causal: the padding after them changes nothing), the
     * same window on every device's row. */
    int64_t w = len < t ? len : t;
    for (int64_t r = 0; r < devices; r++)
      for (int64_t j = 0; j < t; j++) x[r * t + j] = j < w ? text[len - w + j] : 0;
    pmap_array xs = {x, PMAP_I32, 2, {devices, t, 0, 0}};
    pmap_array o = {out, PMAP_F32, 3, {devices, t, VOCAB, 0}};
    if (pmap_predict(params, &xs, &o)) {
      rc = fail(msg, size, "--sample: %s", pmap_last_error());
      break;
    }
    const float *z = out + (w - 1) * VOCAB;
    int best = 0;
    for (int k = 1; k < VOCAB; k++)
      if (z[k] > z[best]) best = k;
    if (temperature > 0.0f) {
      double sum = 0.0;
      for (int k = 0; k < VOCAB; k++) sum += p[k] = exp(((double)z[k] - z[best]) / temperature);
      double u = (double)(mix64(s++) >> 11) * 0x1.0p-53 * sum;
      for (best = 0; best < VOCAB - 1 && u >= p[best]; best++) u -= p[best];
    }
    text[len++] = (unsigned char)best;
  }
  if (!rc) fwrite(text + plen, 1, (size_t)n, f);
  free(text), free(x), free(out), free(p);
  return rc;
}
