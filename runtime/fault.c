/* fault.c: the PMAP_FAULT parser and the one-shot trigger behind the fault hooks (fault.h). */
#include "fault.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

struct pmap_fault {
  fault_kind kind;
  int device;           /* global, as parsed */
  int local;            /* the local index of device in this process, -1: another process's */
  int64_t step;         /* -1: the first step that reaches the hook */
  int64_t after;        /* alloc: how many allocations of the device succeed first */
  _Atomic int64_t seen; /* alloc: allocations counted so far */
  _Atomic int fired;
};

static const char *const kind_names[] = {"alloc", "collective", "stall", "nan", "drift", "gather"};

static int parse_int(const char *s, size_t len, int64_t lo, int64_t hi, int64_t *out) {
  char buf[32];
  if (len == 0 || len >= sizeof buf) return -1;
  memcpy(buf, s, len);
  buf[len] = '\0';
  char *end = NULL;
  errno = 0;
  long long v = strtoll(buf, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

pmap_status pmap_fault_parse(const char *spec, pmap_fault **out) {
  *out = NULL;
  if (!spec || !*spec) return PMAP_SUCCESS;
  pmap_fault f = {.kind = FAULT_ALLOC, .device = 0, .local = 0, .step = -1, .after = 0};
  size_t len = strcspn(spec, ":");
  int k = -1;
  for (int i = 0; i < (int)(sizeof kind_names / sizeof *kind_names); i++)
    if (strlen(kind_names[i]) == len && !strncmp(spec, kind_names[i], len)) k = i;
  const char *p = spec + len;
  int ok = k >= 0, seen[3] = {0, 0, 0}; /* device, step, after */
  const char *twice = NULL;
  while (ok && *p == ':') {
    p++;
    size_t n = strcspn(p, ":"), eq = strcspn(p, "=");
    int64_t v = 0;
    int key = -1;
    if (eq >= n) {
      ok = 0;
    } else if (eq == 6 && !strncmp(p, "device", 6)) {
      ok = !parse_int(p + 7, n - 7, 0, PMAP_MAX_DEVICES - 1, &v);
      f.device = (int)v;
      key = 0;
    } else if (eq == 4 && !strncmp(p, "step", 4)) {
      ok = !parse_int(p + 5, n - 5, 1, INT64_MAX, &v); /* steps count from 1 */
      f.step = v;
      key = 1;
    } else if (eq == 5 && !strncmp(p, "after", 5)) {
      ok = !parse_int(p + 6, n - 6, 0, INT64_MAX, &v);
      f.after = v;
      key = 2;
    } else {
      ok = 0;
    }
    if (key >= 0 && seen[key]++ && !twice)
      twice = key == 0 ? "device" : key == 1 ? "step" : "after";
    p += n;
  }
  if (!ok || *p)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "environment variable PMAP_FAULT=\"%s\" is not "
                    "kind[:device=K][:step=S][:after=A] with kind alloc, "
                    "collective, stall, nan, drift or gather (S >= 1: steps count from 1)",
                    spec);
  /* A key given twice, or one the kind never reads, would be ignored without a word. */
  if (twice)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "environment variable PMAP_FAULT=\"%s\" gives %s= twice (one fault, each "
                    "key at most once)",
                    spec, twice);
  if (seen[2] && k != FAULT_ALLOC && k != FAULT_GATHER)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "environment variable PMAP_FAULT=\"%s\": after=A is for alloc (the A-th "
                    "allocation fails) and gather (A more failed attempts); a %s fault fires "
                    "once, at its step",
                    spec, kind_names[k]);
  if (seen[1] && k == FAULT_ALLOC)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "environment variable PMAP_FAULT=\"%s\": an alloc fault counts "
                    "allocations, not steps: give after=A (the A-th allocation fails), not step=S",
                    spec);
  f.kind = (fault_kind)k;
  f.local = f.device;
  pmap_fault *h = malloc(sizeof *h);
  if (!h) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "PMAP_FAULT: out of memory");
  *h = f;
  atomic_init(&h->seen, 0);
  atomic_init(&h->fired, 0);
  *out = h;
  return PMAP_SUCCESS;
}

void pmap_fault_free(pmap_fault *f) { free(f); }

pmap_status pmap_fault_bind(pmap_fault *f, int n, int proc, int nproc, int shard_off) {
  if (!f) return PMAP_SUCCESS;
  if (f->device >= n * nproc)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "environment variable PMAP_FAULT names device %d, but the context has %d "
                    "device%s (0..%d%s): the fault would never fire",
                    f->device, n * nproc, n * nproc > 1 ? "s" : "", n * nproc - 1,
                    nproc > 1 ? ", global indices over every process" : "");
  if (f->kind == FAULT_GATHER && (n * nproc == 1 || nproc > 1 || shard_off))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "environment variable PMAP_FAULT asks for a gather fault, which fires in the "
                    "all-gather of a sharded optimizer, and this context never shards one (%s): "
                    "the fault would never fire",
                    n * nproc == 1 ? "one device"
                    : nproc > 1    ? "the optimizer is not sharded across processes"
                                : "shard_optimizer is PMAP_SHARD_OFF, or PMAP_SHARD_OPTIMIZER=0");
  f->local = f->device / n == proc ? f->device % n : -1;
  return PMAP_SUCCESS;
}

int pmap_fault_is(const pmap_fault *f, fault_kind kind) { return f && f->kind == kind; }

int pmap_fault_fires(pmap_fault *f, fault_kind kind, int device, int64_t step) {
  if (!f || f->kind != kind || f->local != device) return 0;
  if (kind == FAULT_ALLOC && atomic_fetch_add(&f->seen, 1) != f->after) return 0;
  if (kind != FAULT_ALLOC && f->step >= 0 && f->step != step) return 0;
  if (kind == FAULT_GATHER) return atomic_fetch_add(&f->seen, 1) <= f->after;
  int expected = 0;
  return atomic_compare_exchange_strong(&f->fired, &expected, 1);
}
