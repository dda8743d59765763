/* train_text.h: pmap-train's language models: the transformer (gpt-mini's, or sized by
 * --context, --depth, --width, --heads), byte-level text as data (random windows per step drawn
 * from the seed, a held-out tail), the held-out loss and perplexity, and sampling bytes from a
 * trained model. */
#ifndef PMAP_TOOLS_TRAIN_TEXT_H
#define PMAP_TOOLS_TRAIN_TEXT_H

#include <stdint.h>
#include <stdio.h>

#include "pmap.h"

typedef struct text_data {
  unsigned char *bytes;
  int64_t n;       /* bytes of the file */
  int64_t train_n; /* [0, train_n) trains; [train_n, n) is held out */
  int64_t t;       /* context */
  uint64_t seed;
  int32_t *xb, *yb; /* one global batch */
  int64_t cap;      /* rows they hold */
} text_data;

/* Reads the file; the last eval_fraction of it (at least context + 1 bytes) is held out, and the
 * rest must hold a window of context + 1 bytes. -1 with a message on any error. */
int text_load(const char *path, int64_t context, double eval_fraction, uint64_t seed, text_data *d,
              char *msg, size_t size);
void text_free(text_data *d);

/* Step `step`'s global batch: row i is the window of context + 1 bytes of the training part that
 * starts at a place drawn from (seed, step, i), xs its first context bytes and ys the next
 * (i32 (batch, context)): the same for any device count. xs and ys point into d until the next
 * call. */
int text_batch(text_data *d, int64_t step, int64_t batch, pmap_array *xs, pmap_array *ys, char *msg,
               size_t size);

/* Mean per-token cross-entropy (nats) of params on the held-out part, over its whole windows of
 * context + 1 bytes (at most 256 of them), predicted on `devices` devices at most `piece`
 * windows a call (the training batch, so that the prediction stays inside the step's plan). */
int text_eval(text_data *d, pmap_params *params, int devices, int64_t piece, double *loss,
              char *msg, size_t size);

/* Writes n bytes generated after prompt (plen bytes, at least 1) to f: each step predicts the
 * next byte from the last `context` bytes, greedily (temperature 0) or drawn from softmax(logits
 * / temperature) with a stream seeded by seed. */
int text_sample(pmap_params *params, int devices, int64_t context, const unsigned char *prompt,
                int64_t plen, int64_t n, float temperature, uint64_t seed, FILE *f, char *msg,
                size_t size);

#endif
