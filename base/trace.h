/* trace.h: the timeline recorder. A recorder holds one track per thread that records (the
 * runtime gives each device its own and the caller one more); each track is written by one
 * thread only, so recording takes no lock. Spans are kept per step in a ring of K steps (the
 * last K) or for steps A..B alone, so a recording never grows past its window; the file is a
 * Chrome trace-event JSON file (Perfetto, chrome://tracing). The recorder knows nothing of what
 * it records: each room names its own spans. */
#ifndef PMAP_BASE_TRACE_H
#define PMAP_BASE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "pmap.h"

typedef struct trace_rec trace_rec;

/* At most this many spans of one track in one step; more are counted as dropped. The last
 * TRACE_SPANS_KEPT of them are kept for the spans trace_span_kept records (the step's own
 * span, its gradient reduction, its optimizer), so that a step with too many layer spans still
 * shows how it ended. */
#define TRACE_SPANS_PER_STEP 65536
#define TRACE_SPANS_KEPT 64

/* The window: the last `keep` steps (keep > 0), or steps first..last (keep == 0). */
typedef struct trace_window {
  int64_t keep, first, last;
} trace_window;

/* Parses "K" (the last K steps, 1..10000), "A..B" (steps A to B, 1 <= A <= B, at most 10000
 * steps) or NULL / "" (the last 10 steps) into *w; PMAP_ERR_INVALID_ARGUMENT naming spec (what names
 * where it came from, e.g. "environment variable PMAP_TRACE_STEPS"). */
pmap_status trace_window_parse(const char *spec, const char *what, trace_window *w);

/* A recorder of `tracks` tracks; time 0 of the file is origin_ns (a pmap_now_ns value). */
pmap_status trace_create(int tracks, trace_window w, int64_t origin_ns, trace_rec **out);
void trace_destroy(trace_rec *t); /* accepts NULL */

/* The step spans recorded from now on belong to (set by the thread that starts the work of a
 * step, before the tracks' threads start it). */
void trace_set_step(trace_rec *t, int64_t step);
int64_t trace_step(const trace_rec *t);

/* One span of track `track`, [t0, t1) in pmap_now_ns time. name, detail (NULL: none) and cat
 * are strings that outlive the recorder (literals); the span is named "name detail index"
 * (index < 0: none), e.g. "forward dense 3" or "wait pmap_update's all-reduce"; bytes >= 0 goes
 * to the span's arguments. Outside the window it is not kept. */
void trace_span(trace_rec *t, int track, const char *name, const char *detail, int index,
                const char *cat, int64_t t0, int64_t t1, int64_t bytes);
/* The same, for a span that may take the room kept past the others' limit. */
void trace_span_kept(trace_rec *t, int track, const char *name, const char *detail, int index,
                     const char *cat, int64_t t0, int64_t t1, int64_t bytes);

/* Writes the recording to path (atomically): pid is the process (its index), names[track] each
 * track's name, process_name the process's. Returns a failure naming the file
 * and the reason when it cannot be written (atomic_file_write's status). Spans dropped (over TRACE_SPANS_PER_STEP) are
 * counted in the metadata. */
pmap_status trace_write(const trace_rec *t, const char *path, int pid, const char *process_name,
                        const char *const *names);

#endif
