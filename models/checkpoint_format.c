/* checkpoint_format.c: the checkpoint file format (docs/reliability.md has the table):
 * little-endian fixed-width fields, a versioned header, five sections each with a CRC-32C. A
 * file is encoded from host copies of the state and validated completely (frames, checksums,
 * the model against the params', the optimizer and every size) before anything is decoded. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "checkpoint.h"
#include "crc32c.h"

#define CKPT_MAGIC "PMAPCKPT"
/* Version 1: float training; version 2 (written for bf16 training alone, so that a float
 * run's files stay readable by earlier builds) adds the precision policy to OPTM. */
#define CKPT_VERSION 1u
#define CKPT_VERSION_BF16 2u
#define HEADER_BYTES 32u  /* magic, version, sections, file bytes, flags, header CRC */
#define SECTION_BYTES 16u /* tag, CRC, payload bytes */
#define LAYER_BYTES 64u
#define N_SECTIONS 5

static const char tags[N_SECTIONS][5] = {"MODL", "OPTM", "PARM", "OSTA", "USER"};
enum { SEC_MODEL, SEC_OPT, SEC_PARAMS, SEC_STATE, SEC_USER };

/* ------------------------------------------------------------------------------------------ */
/* Little-endian encoding into a growing buffer                                                */

typedef struct wbuf {
  unsigned char *p;
  size_t n, cap;
  int oom;
} wbuf;

/* Makes room for n more bytes; sets oom when it cannot. */
static int reserve(wbuf *b, size_t n) {
  if (b->oom) return 0;
  if (n > SIZE_MAX / 4 - b->n) { /* the doubling below then stays below SIZE_MAX / 2 */
    b->oom = 1;
    return 0;
  }
  if (b->n + n <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->n + n) cap *= 2;
  unsigned char *np = realloc(b->p, cap);
  if (!np) {
    b->oom = 1;
    return 0;
  }
  b->p = np;
  b->cap = cap;
  return 1;
}

static void put(wbuf *b, const void *src, size_t n) {
  if (!reserve(b, n)) return;
  memcpy(b->p + b->n, src, n);
  b->n += n;
}

static void store_u32(unsigned char *d, uint32_t v) {
  for (int i = 0; i < 4; i++) d[i] = (unsigned char)(v >> (8 * i));
}
static void store_u64(unsigned char *d, uint64_t v) {
  for (int i = 0; i < 8; i++) d[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t load_u32(const unsigned char *s) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)s[i] << (8 * i);
  return v;
}
static uint64_t load_u64(const unsigned char *s) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)s[i] << (8 * i);
  return v;
}

static void put_u32(wbuf *b, uint32_t v) {
  unsigned char d[4];
  store_u32(d, v);
  put(b, d, 4);
}
static void put_u64(wbuf *b, uint64_t v) {
  unsigned char d[8];
  store_u64(d, v);
  put(b, d, 8);
}
static void put_f32(wbuf *b, float f) {
  uint32_t v;
  memcpy(&v, &f, 4);
  put_u32(b, v);
}
static void put_floats(wbuf *b, const float *x, size_t n) {
  if (n > SIZE_MAX / 8 || !reserve(b, 4 * n)) return;
  for (size_t i = 0; i < n; i++) {
    uint32_t v;
    memcpy(&v, &x[i], 4);
    store_u32(b->p + b->n + 4 * i, v);
  }
  b->n += 4 * n;
}
static float load_f32(const unsigned char *s) {
  uint32_t v = load_u32(s);
  float f;
  memcpy(&f, &v, 4);
  return f;
}

/* The model description: everything that fixes the parameter layout and the loss. */
static void put_model(wbuf *b, const pmap_model *m) {
  put_u32(b, (uint32_t)m->in_rank);
  put_u32(b, m->loss == PMAP_LOSS_TOKEN_XENT ? 3u : m->loss == PMAP_LOSS_SOFTMAX_XENT ? 2u : 1u);
  for (int i = 0; i < 3; i++) put_u64(b, (uint64_t)(i < m->in_rank ? m->in_shape[i] : 0));
  put_u32(b, (uint32_t)m->n_layers);
  put_u32(b, 0);
  put_u64(b, (uint64_t)m->n_params);
  for (int i = 0; i < m->n_layers; i++) {
    const layer *l = &m->layers[i];
    /* The layer's code and its four geometry words come from its class (models/layers/): conv
     * kernel, stride and pad; pool kernel and stride; dropout's rate (its bits); batch norm's
     * cross_replica (its state, 2C after beta, follows from the code and C); a residual
     * block's other end. */
    put_u32(b, l->cls->code);
    put_u32(b, (uint32_t)l->out_rank);
    for (int k = 0; k < 3; k++) put_u64(b, (uint64_t)(k < l->out_rank ? l->out_shape[k] : 0));
    put_u64(b, (uint64_t)l->w_size);
    put_u64(b, (uint64_t)l->b_size);
    uint32_t g[4];
    layer_geometry(l, g);
    for (int k = 0; k < 4; k++) put_u32(b, g[k]);
  }
}
#define MODEL_HEAD_BYTES 48u

/* The file's optimizer codes: 1 SGD, 2 Adam, 3 AdamW (a switch over every kind, no default). */
static uint32_t opt_code(pmap_optimizer_kind k) {
  switch (k) {
  case PMAP_OPT_SGD: return 1u;
  case PMAP_OPT_ADAM: return 2u;
  case PMAP_OPT_ADAMW: return 3u;
  }
  return 0u;
}
static const char *opt_name(uint32_t code, uint32_t slots) {
  if (code == 3) return "AdamW";
  if (code == 2) return "Adam";
  if (code == 1) return slots ? "SGD with momentum" : "SGD without momentum";
  return "an unknown optimizer";
}

static size_t begin_section(wbuf *b, int sec) {
  size_t at = b->n;
  put(b, tags[sec], 4);
  put_u32(b, 0);
  put_u64(b, 0);
  return at;
}

/* Fills in the section's length and its CRC-32C over tag, length and payload. */
static void end_section(wbuf *b, size_t at) {
  if (b->oom) return;
  uint64_t len = b->n - at - SECTION_BYTES;
  store_u64(b->p + at + 8, len);
  uint32_t c = crc32c_update(0, b->p + at, 4);
  c = crc32c_update(c, b->p + at + 8, 8 + (size_t)len);
  store_u32(b->p + at + 4, c);
}

static void encode(wbuf *b, const pmap_params *p, const ckpt_host *h, const void *user,
                   size_t user_bytes) {
  size_t P = p->n_params, S = (size_t)p->opt_slots * P;
  int bf16 = p->precision == PMAP_PRECISION_BF16;
  put(b, CKPT_MAGIC, 8);
  put_u32(b, bf16 ? CKPT_VERSION_BF16 : CKPT_VERSION);
  put_u32(b, N_SECTIONS);
  put_u64(b, 0); /* file bytes, filled in below */
  put_u32(b, 0); /* flags */
  put_u32(b, 0); /* header CRC */
  size_t at = begin_section(b, SEC_MODEL);
  put_model(b, p->model);
  end_section(b, at);
  at = begin_section(b, SEC_OPT);
  const pmap_optimizer *o = &p->opt;
  put_u32(b, opt_code(o->kind));
  put_u32(b, (uint32_t)p->opt_slots);
  put_f32(b, o->lr);
  put_f32(b, o->momentum);
  put_f32(b, o->beta1);
  put_f32(b, o->beta2);
  put_f32(b, o->eps);
  put_f32(b, o->clip_norm);
  put_u64(b, (uint64_t)p->step);
  if (bf16) put_u32(b, 2u); /* the policy: 1 fp32, 2 bf16 */
  end_section(b, at);
  at = begin_section(b, SEC_PARAMS);
  put_u64(b, (uint64_t)P);
  put_floats(b, h->w, P);
  end_section(b, at);
  at = begin_section(b, SEC_STATE);
  put_u32(b, (uint32_t)p->opt_slots);
  put_u32(b, 0);
  put_u64(b, (uint64_t)S);
  put_floats(b, h->opt, S);
  end_section(b, at);
  at = begin_section(b, SEC_USER);
  if (user_bytes) put(b, user, user_bytes);
  end_section(b, at);
  if (b->oom) return;
  store_u64(b->p + 16, (uint64_t)b->n);
  store_u32(b->p + 28, crc32c_update(0, b->p, 28));
}

pmap_status ckpt_encode(const pmap_params *p, const ckpt_host *h, const void *user,
                        size_t user_bytes, unsigned char **out, size_t *n, const char *call) {
  wbuf b = {0};
  encode(&b, p, h, user, user_bytes);
  if (b.oom) {
    free(b.p);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory encoding %zu parameters", call,
                    p->n_params);
  }
  *out = b.p;
  *n = b.n;
  return PMAP_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Validation and load                                                                         */

/* The header (f: its HEADER_BYTES) of a file of n bytes: magic, version, CRC, length. */
static pmap_status check_header(const char *path, const unsigned char *f, size_t n,
                                const char *call) {
  if (memcmp(f, CKPT_MAGIC, 8) != 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\" is not a pmap checkpoint (bad magic "
                    "number)",
                    call, path);
  uint32_t version = load_u32(f + 8);
  if (version != CKPT_VERSION && version != CKPT_VERSION_BF16)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\" is checkpoint version %u; this build "
                    "reads versions %u and %u",
                    call, path, version, CKPT_VERSION, CKPT_VERSION_BF16);
  uint32_t hcrc = crc32c_update(0, f, 28);
  if (load_u32(f + 28) != hcrc)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\" is damaged: header checksum 0x%08x, "
                    "computed 0x%08x",
                    call, path, load_u32(f + 28), hcrc);
  uint64_t total = load_u64(f + 16);
  if (total != n)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\" is %s: the header says %llu bytes, "
                    "the file has %zu",
                    call, path, total > n ? "truncated" : "too long", (unsigned long long)total, n);
  if (load_u32(f + 12) != N_SECTIONS || load_u32(f + 24) != 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\" has %u sections and flags 0x%x; "
                    "version %u has %d sections and no flags",
                    call, path, load_u32(f + 12), load_u32(f + 24), version, N_SECTIONS);
  return PMAP_SUCCESS;
}

/* Reads the whole file: its length comes from fstat, never from its contents, and the header
 * must agree with it before anything is allocated. */
static pmap_status read_file(const char *path, unsigned char **out, size_t *n, const char *call) {
  /* Non-blocking: opening a FIFO without a writer returns at once (and is then refused as not a
   * regular file) instead of waiting for one; reads of a regular file ignore the flag. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: cannot open \"%s\": %s", call, path,
                    strerror(errno));
  struct stat sb;
  pmap_status st = PMAP_SUCCESS;
  unsigned char *buf = NULL;
  if (fstat(fd, &sb) != 0) {
    st = PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: cannot stat \"%s\": %s", call, path, strerror(errno));
  } else if (!S_ISREG(sb.st_mode)) {
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: \"%s\" is not a regular file", call, path);
  } else if (sb.st_size < (off_t)HEADER_BYTES) {
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: \"%s\" is truncated: %lld bytes, shorter than "
                  "the %u-byte header of a pmap checkpoint",
                  call, path, (long long)sb.st_size, HEADER_BYTES);
  } else if ((uint64_t)sb.st_size > (uint64_t)(SIZE_MAX / 2)) {
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: \"%s\" is too large (%lld bytes)", call, path,
                  (long long)sb.st_size);
  } else {
    unsigned char h[HEADER_BYTES];
    ssize_t r = pread(fd, h, HEADER_BYTES, 0);
    if (r != (ssize_t)HEADER_BYTES)
      st = PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: cannot read \"%s\": %s", call, path,
                    r < 0 ? strerror(errno) : "short read");
    else
      st = check_header(path, h, (size_t)sb.st_size, call);
  }
  if (!st && !(buf = malloc((size_t)sb.st_size)))
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld bytes of \"%s\"", call,
                  (long long)sb.st_size, path);
  size_t got = 0, want = st ? 0 : (size_t)sb.st_size;
  while (got < want) {
    ssize_t r = read(fd, buf + got, want - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      st = r < 0 ? PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: cannot read \"%s\": %s", call, path,
                            strerror(errno))
                 : PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                            "%s: \"%s\" shrank while being read "
                            "(%zu of %zu bytes)",
                            call, path, got, want);
      break;
    }
    got += (size_t)r;
  }
  close(fd);
  if (st) {
    free(buf);
    return st;
  }
  *out = buf;
  *n = want;
  return PMAP_SUCCESS;
}

typedef struct section {
  const unsigned char *data;
  size_t bytes;
} section;

/* Header and section frames: every length and every CRC. */
static pmap_status check_frames(const char *path, const unsigned char *f, size_t n,
                                section sec[N_SECTIONS], const char *call) {
  PMAP_TRY(check_header(path, f, n, call)); /* again: the file may have changed since */
  size_t at = HEADER_BYTES;
  for (int i = 0; i < N_SECTIONS; i++) {
    if (n - at < SECTION_BYTES)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: \"%s\" is truncated before section %s", call,
                      path, tags[i]);
    const unsigned char *h = f + at;
    if (memcmp(h, tags[i], 4) != 0)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: \"%s\" is damaged: section %d is not %s",
                      call, path, i, tags[i]);
    uint64_t len = load_u64(h + 8);
    if (len > n - at - SECTION_BYTES)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: \"%s\" is damaged: section %s claims %llu "
                      "bytes, %zu remain",
                      call, path, tags[i], (unsigned long long)len, n - at - SECTION_BYTES);
    uint32_t c = crc32c_update(crc32c_update(0, h, 4), h + 8, 8 + (size_t)len);
    if (load_u32(h + 4) != c)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: \"%s\" is damaged: section %s checksum "
                      "0x%08x, computed 0x%08x",
                      call, path, tags[i], load_u32(h + 4), c);
    sec[i].data = h + SECTION_BYTES;
    sec[i].bytes = (size_t)len;
    at += SECTION_BYTES + (size_t)len;
  }
  if (at != n)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: \"%s\" has %zu bytes after its last section",
                    call, path, n - at);
  return PMAP_SUCCESS;
}

/* The file's model against params' model; the message names the first difference. */
static pmap_status check_model_section(const pmap_params *p, const section *s, const char *path,
                                       const char *call) {
  wbuf mine = {0};
  put_model(&mine, p->model);
  if (mine.oom) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory", call);
  int same = mine.n == s->bytes && memcmp(mine.p, s->data, s->bytes) == 0;
  if (same || s->bytes < MODEL_HEAD_BYTES) {
    free(mine.p);
    if (same) return PMAP_SUCCESS;
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\" holds a model description of %zu "
                    "bytes, too short",
                    call, path, s->bytes);
  }
  uint32_t layers = load_u32(s->data + 32);
  uint64_t count = load_u64(s->data + 40);
  const pmap_model *m = p->model;
  int first = 0;
  for (; first < m->n_layers && (uint64_t)first < layers; first++) {
    size_t off = MODEL_HEAD_BYTES + (size_t)first * LAYER_BYTES;
    if (off + LAYER_BYTES > s->bytes || memcmp(mine.p + off, s->data + off, LAYER_BYTES) != 0)
      break;
  }
  free(mine.p);
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: \"%s\" holds another model: %u layers, %llu "
                  "parameters; params' model has %d layers, %zu parameters (first difference at "
                  "layer %d, or in the input shape or loss)",
                  call, path, layers, (unsigned long long)count, m->n_layers, p->n_params, first);
}

/* Optimizer kind, state layout and step; the state sizes against the parameter count. */
static pmap_status check_state_sections(const pmap_params *p, const section *sec, const char *path,
                                        uint32_t version, int64_t *step, pmap_precision *prec,
                                        const char *call) {
  const section *o = &sec[SEC_OPT];
  size_t want = version == CKPT_VERSION ? 40 : 44;
  if (o->bytes != want)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\": optimizer section of %zu bytes, "
                    "expected %zu (version %u)",
                    call, path, o->bytes, want, version);
  uint32_t policy = version == CKPT_VERSION ? 1u : load_u32(o->data + 40);
  if (policy != 1u && policy != 2u)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\": precision policy %u is neither 1 (fp32) nor 2 (bf16)", call, path,
                    policy);
  *prec = policy == 2u ? PMAP_PRECISION_BF16 : PMAP_PRECISION_FP32;
  uint32_t kind = load_u32(o->data), slots = load_u32(o->data + 4);
  uint32_t want_kind = opt_code(p->opt.kind), want_slots = (uint32_t)p->opt_slots;
  if (kind != want_kind || slots != want_slots)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\" holds another optimizer: %s (%u state "
                    "slots); params use %s (%u)",
                    call, path, opt_name(kind, slots), slots, opt_name(want_kind, want_slots),
                    want_slots);
  uint64_t st = load_u64(o->data + 32);
  if (st > (uint64_t)PARAMS_STEP_MAX)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\": step %llu is out of range (a step count is at most 2^63 - 2)",
                    call, path, (unsigned long long)st);
  *step = (int64_t)st;
  size_t P = p->n_params, S = (size_t)p->opt_slots * P;
  const section *w = &sec[SEC_PARAMS], *s = &sec[SEC_STATE];
  if (w->bytes < 8 || load_u64(w->data) != P || w->bytes - 8 != P * 4)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\": parameter section of %zu bytes (%llu "
                    "parameters); params hold %zu",
                    call, path, w->bytes,
                    w->bytes >= 8 ? (unsigned long long)load_u64(w->data) : 0ull, P);
  if (s->bytes < 16 || load_u32(s->data) != slots || load_u64(s->data + 8) != S ||
      s->bytes - 16 != S * 4)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: \"%s\": optimizer state section of %zu bytes; "
                    "params need %zu values",
                    call, path, s->bytes, S);
  return PMAP_SUCCESS;
}

pmap_status ckpt_read(const pmap_params *p, const char *path, const char *call, ckpt_file *out) {
  memset(out, 0, sizeof *out);
  unsigned char *f = NULL;
  size_t n = 0;
  PMAP_TRY(read_file(path, &f, &n, call));
  section sec[N_SECTIONS];
  int64_t step = 0;
  pmap_precision prec = PMAP_PRECISION_FP32;
  pmap_status st = check_frames(path, f, n, sec, call);
  if (!st) st = check_model_section(p, &sec[SEC_MODEL], path, call);
  if (!st) st = check_state_sections(p, sec, path, load_u32(f + 8), &step, &prec, call);
  if (st) {
    free(f);
    return st;
  }
  out->bytes = f;
  out->step = step;
  out->precision = prec;
  out->params = sec[SEC_PARAMS].data + 8;
  out->state = sec[SEC_STATE].data + 16;
  out->user = sec[SEC_USER].data;
  out->user_bytes = sec[SEC_USER].bytes;
  return PMAP_SUCCESS;
}

void ckpt_decode(const pmap_params *p, const ckpt_file *f, ckpt_host *h) {
  size_t P = p->n_params, S = (size_t)p->opt_slots * P;
  for (size_t i = 0; i < P; i++) h->w[i] = load_f32(f->params + 4 * i);
  for (size_t i = 0; i < S; i++) h->opt[i] = load_f32(f->state + 4 * i);
}

void ckpt_file_free(ckpt_file *f) {
  free(f->bytes);
  memset(f, 0, sizeof *f);
}
