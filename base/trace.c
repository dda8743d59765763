/* trace.c: the timeline recorder (trace.h): per track a ring of step slots, each a growing array
 * of spans that is reused (never shrunk) when its slot comes round again, and the writer of the
 * trace-event JSON file. */
#include "trace.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atomic_file.h"
#include "error.h"

typedef struct span {
  int64_t t0, t1, bytes;
  const char *name, *detail, *cat;
  int index;
} span;

typedef struct slot {
  int64_t step; /* -1: empty */
  span *s;
  size_t n, cap;
} slot;

typedef struct track_buf {
  slot *slots; /* (nslots) */
  int64_t dropped;
} track_buf;

struct trace_rec {
  int ntracks;
  trace_window w;
  int64_t nslots, origin;
  _Atomic int64_t step;
  track_buf *tracks;
};

/* Steps a window may hold: its slots are allocated up front for every track. */
#define WINDOW_MAX 10000

/* A decimal count at p: digits only (no space, no sign), *end after them; -1 when there is none
 * or it overflows. */
static long long count_at(const char *p, char **end) {
  *end = (char *)p;
  if (*p < '0' || *p > '9') return -1;
  errno = 0;
  long long v = strtoll(p, end, 10);
  return errno ? -1 : v;
}

pmap_status trace_window_parse(const char *spec, const char *what, trace_window *w) {
  *w = (trace_window){10, 0, 0};
  if (!spec || !*spec) return PMAP_SUCCESS;
  char *end = NULL;
  long long a = count_at(spec, &end);
  if (!*end && a >= 1 && a <= WINDOW_MAX) {
    w->keep = a;
    return PMAP_SUCCESS;
  }
  if (a >= 0 && end[0] == '.' && end[1] == '.') {
    const char *b0 = end + 2;
    long long b = count_at(b0, &end);
    if (a >= 1 && b >= 0 && !*end && b >= a && b - a < WINDOW_MAX) {
      *w = (trace_window){0, a, b};
      return PMAP_SUCCESS;
    }
  }
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s \"%s\" is neither K (the last K steps, 1..%d) nor A..B (steps A to B, "
                  "1 <= A <= B, at most %d steps; steps count from 1)",
                  what, spec, WINDOW_MAX, WINDOW_MAX);
}

pmap_status trace_create(int tracks, trace_window w, int64_t origin_ns, trace_rec **out) {
  *out = NULL;
  trace_rec *t = calloc(1, sizeof *t);
  if (!t) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "trace: out of memory");
  t->ntracks = tracks;
  t->w = w;
  t->nslots = w.keep > 0 ? w.keep : w.last - w.first + 1;
  t->origin = origin_ns;
  atomic_init(&t->step, 0);
  t->tracks = calloc((size_t)tracks, sizeof *t->tracks);
  if (!t->tracks) goto oom;
  for (int k = 0; k < tracks; k++) {
    t->tracks[k].slots = calloc((size_t)t->nslots, sizeof(slot));
    if (!t->tracks[k].slots) goto oom;
    for (int64_t s = 0; s < t->nslots; s++) t->tracks[k].slots[s].step = -1;
  }
  *out = t;
  return PMAP_SUCCESS;
oom:;
  long long steps = (long long)t->nslots;
  trace_destroy(t);
  return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "trace: out of memory for %d tracks of %lld steps",
                  tracks, steps);
}

void trace_destroy(trace_rec *t) {
  if (!t) return;
  for (int k = 0; t->tracks && k < t->ntracks; k++) {
    for (int64_t s = 0; t->tracks[k].slots && s < t->nslots; s++) free(t->tracks[k].slots[s].s);
    free(t->tracks[k].slots);
  }
  free(t->tracks);
  free(t);
}

void trace_set_step(trace_rec *t, int64_t step) {
  atomic_store_explicit(&t->step, step, memory_order_relaxed);
}

int64_t trace_step(const trace_rec *t) {
  return atomic_load_explicit(&((trace_rec *)t)->step, memory_order_relaxed);
}

static void record(trace_rec *t, int track, const char *name, const char *detail, int index,
                   const char *cat, int64_t t0, int64_t t1, int64_t bytes, int kept) {
  if (track < 0 || track >= t->ntracks) return;
  int64_t step = trace_step(t);
  if (step < 0) return;
  if (t->w.keep == 0 && (step < t->w.first || step > t->w.last)) return;
  track_buf *tr = &t->tracks[track];
  slot *sl = &tr->slots[step % t->nslots];
  if (sl->step != step) {
    if (sl->step > step) return; /* a newer step holds the slot */
    sl->step = step;
    sl->n = 0;
  }
  if (sl->n >= (size_t)(kept ? TRACE_SPANS_PER_STEP : TRACE_SPANS_PER_STEP - TRACE_SPANS_KEPT)) {
    tr->dropped++;
    return;
  }
  if (sl->n == sl->cap) {
    size_t cap = sl->cap ? 2 * sl->cap : 64;
    span *s = cap <= TRACE_SPANS_PER_STEP ? realloc(sl->s, cap * sizeof *s) : NULL;
    if (!s) {
      tr->dropped++;
      return;
    }
    sl->s = s;
    sl->cap = cap;
  }
  sl->s[sl->n++] = (span){t0, t1, bytes, name, detail, cat, index};
}

void trace_span(trace_rec *t, int track, const char *name, const char *detail, int index,
                const char *cat, int64_t t0, int64_t t1, int64_t bytes) {
  record(t, track, name, detail, index, cat, t0, t1, bytes, 0);
}

void trace_span_kept(trace_rec *t, int track, const char *name, const char *detail, int index,
                     const char *cat, int64_t t0, int64_t t1, int64_t bytes) {
  record(t, track, name, detail, index, cat, t0, t1, bytes, 1);
}

/* A string's characters as JSON escapes them (a call's name holds quotes, a host name anything). */
static void json_chars(FILE *f, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  json_chars(f, s);
  fputc('"', f);
}

static void write_events(const trace_rec *t, FILE *f, int pid, const char *process_name,
                         const char *const *names) {
  int64_t newest = -1, dropped = 0;
  for (int k = 0; k < t->ntracks; k++) {
    dropped += t->tracks[k].dropped;
    for (int64_t s = 0; s < t->nslots; s++)
      if (t->tracks[k].slots[s].step > newest) newest = t->tracks[k].slots[s].step;
  }
  fprintf(f,
          "{\"traceEvents\": [\n{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, "
          "\"tid\": 0, \"args\": {\"name\": ",
          pid);
  json_str(f, process_name);
  fprintf(f, "}}");
  for (int k = 0; k < t->ntracks; k++) {
    fprintf(f,
            ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %d, "
            "\"args\": {\"name\": ",
            pid, k);
    json_str(f, names[k]);
    fprintf(f,
            "}},\n{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": %d, \"tid\": %d, "
            "\"args\": {\"sort_index\": %d}}",
            pid, k, k);
  }
  for (int k = 0; k < t->ntracks; k++) {
    for (int64_t s = 0; s < t->nslots; s++) {
      const slot *sl = &t->tracks[k].slots[s];
      if (sl->step < 0 || (t->w.keep > 0 && sl->step <= newest - t->w.keep)) continue;
      for (size_t i = 0; i < sl->n; i++) {
        const span *sp = &sl->s[i];
        fprintf(f, ",\n{\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, ",
                pid, k, (double)(sp->t0 - t->origin) / 1e3, (double)(sp->t1 - sp->t0) / 1e3);
        fprintf(f, "\"cat\": ");
        json_str(f, sp->cat);
        fprintf(f, ", \"name\": \"");
        json_chars(f, sp->name);
        if (sp->detail) {
          fputc(' ', f);
          json_chars(f, sp->detail);
        }
        if (sp->index >= 0) fprintf(f, " %d", sp->index);
        fprintf(f, "\", \"args\": {\"step\": %lld", (long long)sl->step);
        if (sp->bytes >= 0) fprintf(f, ", \"bytes\": %lld", (long long)sp->bytes);
        fprintf(f, "}}");
      }
    }
  }
  fprintf(f, "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"dropped_spans\": %lld}}\n",
          (long long)dropped);
}

pmap_status trace_write(const trace_rec *t, const char *path, int pid, const char *process_name,
                        const char *const *names) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "trace: out of memory writing \"%s\"", path);
  write_events(t, f, pid, process_name, names);
  if (fclose(f)) {
    free(buf);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "trace: out of memory writing \"%s\"", path);
  }
  pmap_status st = atomic_file_write(path, (const unsigned char *)buf, len, "trace");
  free(buf);
  return st;
}
