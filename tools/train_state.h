/* train_state.h: what pmap-train keeps in a checkpoint's user section to continue a run exactly
 * (the example model, the data seed and shape, the data position and the last loss), and the
 * JSON string writer of its summary line. */
#ifndef PMAP_TOOLS_TRAIN_STATE_H
#define PMAP_TOOLS_TRAIN_STATE_H

#include <stdint.h>
#include <stdio.h>

#define TRAIN_STATE_BYTES 96 /* the user section pmap-train writes */

typedef struct train_state {
  char model[33];     /* example name, at most 32 bytes */
  uint64_t seed;      /* of the parameters (seed) and the data (seed + 1) */
  int64_t batch;      /* global batch */
  int64_t samples;    /* data set rows (a multiple of batch) */
  int64_t next_step;  /* steps taken: the next step's number */
  int64_t next_batch; /* the data position: index of the next step's batch, next_step % batches */
  float last_loss;    /* loss of the last step taken (NaN before the first) */
} train_state;

/* Little-endian fixed layout into buf (TRAIN_STATE_BYTES). Returns -1 for a model name too long. */
int train_state_encode(const train_state *s, unsigned char buf[TRAIN_STATE_BYTES]);
/* Parses and validates n bytes; -1 with a reason in why (why_size bytes) when they are not a
 * pmap-train section of this version. */
int train_state_decode(const unsigned char *buf, size_t n, train_state *s, char *why,
                       size_t why_size);

/* Writes s as a JSON string (quoted, escaped). */
void json_string(FILE *f, const char *s);
/* Writes x as a JSON number with %.9g, or null when it is not finite. */
void json_number(FILE *f, double x);

#endif
