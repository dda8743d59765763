/* train_state.c: pmap-train's checkpoint user section (fixed little-endian layout, see
 * docs/reliability.md) and JSON output helpers. */
#include <math.h>
#include <string.h>

#include "train_state.h"

static const char magic[8] = {'P', 'T', 'R', 'A', 'I', 'N', '0', '1'};

static void put64(unsigned char *d, uint64_t v) {
  for (int i = 0; i < 8; i++) d[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get64(const unsigned char *s) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)s[i] << (8 * i);
  return v;
}

/* Layout: magic (8) | model name, NUL-padded (32) | seed | batch | samples | next_step |
 * next_batch (8 each) | last loss f32 bits (4) | zero (12). */
int train_state_encode(const train_state *s, unsigned char buf[TRAIN_STATE_BYTES]) {
  size_t len = strlen(s->model);
  if (len > 32) return -1;
  memset(buf, 0, TRAIN_STATE_BYTES);
  memcpy(buf, magic, 8);
  memcpy(buf + 8, s->model, len);
  put64(buf + 40, s->seed);
  put64(buf + 48, (uint64_t)s->batch);
  put64(buf + 56, (uint64_t)s->samples);
  put64(buf + 64, (uint64_t)s->next_step);
  put64(buf + 72, (uint64_t)s->next_batch);
  uint32_t bits;
  memcpy(&bits, &s->last_loss, 4);
  for (int i = 0; i < 4; i++) buf[80 + i] = (unsigned char)(bits >> (8 * i));
  return 0;
}

int train_state_decode(const unsigned char *buf, size_t n, train_state *s, char *why,
                       size_t why_size) {
  if (n != TRAIN_STATE_BYTES || memcmp(buf, magic, 8) != 0) {
    snprintf(why, why_size, "its user section (%zu bytes) was not written by this pmap-train", n);
    return -1;
  }
  memset(s, 0, sizeof *s);
  memcpy(s->model, buf + 8, 32);
  s->seed = get64(buf + 40);
  s->batch = (int64_t)get64(buf + 48);
  s->samples = (int64_t)get64(buf + 56);
  s->next_step = (int64_t)get64(buf + 64);
  s->next_batch = (int64_t)get64(buf + 72);
  uint32_t bits = 0;
  for (int i = 0; i < 4; i++) bits |= (uint32_t)buf[80 + i] << (8 * i);
  memcpy(&s->last_loss, &bits, 4);
  if (s->batch <= 0 || s->samples <= 0 || s->samples % s->batch || s->next_step < 0 ||
      s->next_batch != s->next_step % (s->samples / s->batch)) {
    snprintf(why, why_size,
             "its pmap-train section is inconsistent (batch %lld, samples %lld, "
             "step %lld, data position %lld)",
             (long long)s->batch, (long long)s->samples, (long long)s->next_step,
             (long long)s->next_batch);
    return -1;
  }
  return 0;
}

void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20 || *p >= 0x7f)
      fprintf(f, "\\u%04x", *p); /* valid JSON for any bytes */
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

void json_number(FILE *f, double x) {
  if (isfinite(x))
    fprintf(f, "%.9g", x);
  else
    fputs("null", f);
}
