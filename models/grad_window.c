/* grad_window.c: sharded gradients (PMAP_SHARD_GRADS, ZeRO stage 2) on one device. No device
 * holds the whole gradient: the backward pass adds each layer's parameter gradients into a
 * window the size of the largest layer's parameters (replica.gwin, through layer_grad), and
 * right after that layer's backward its piece of the flat vector is reduced (a piece of the
 * reduce-scatter, backend_reduce_part) into the part of the device that owns it, and the window
 * is cleared and moved onto the next layer below. The parameters of a layer whose gradients
 * another layer adds into too (a tied table: the head's use and the embedding's) are held whole
 * for the pass (gpin) and reduced after their own layer. Once the pass is over the tail (the
 * loss and the guard's slots) is reduced alike. Every element is reduced once, over the devices
 * in the order of the whole reduce-scatter, so each device's part is bitwise the one the
 * sharded optimizer's reduce-scatter gives. */
#include <math.h>

#include "base/error.h"
#include "params.h"
#include "runtime/runtime.h"

/* Layer l's parameters and state [*lo, *hi) in the flat vector; 0 when it has none. */
static int layer_span(const layer *l, size_t *lo, size_t *hi) {
  *lo = l->w_off;
  *hi = l->s_off + l->s_size;
  return *hi > *lo;
}

int grad_window_plan(const pmap_model *m, size_t *cap, size_t *pin_lo, size_t *pin_len) {
  *cap = *pin_lo = *pin_len = 0;
  int pinned = -1;
  for (int i = 0; i < m->n_layers; i++) {
    const layer *l = &m->layers[i];
    if (!l->gshare_len) continue;
    int owner = -1;
    for (int j = 0; j < m->n_layers; j++) {
      size_t lo = 0, hi = 0;
      if (layer_span(&m->layers[j], &lo, &hi) && l->gshare_off >= lo &&
          l->gshare_len <= hi - l->gshare_off)
        owner = j;
    }
    /* The owner's backward must come after the sharer's (the pinned range is reduced after the
     * owner's), and one range is pinned at most. */
    if (owner < 0 || owner >= i || (pinned >= 0 && pinned != owner)) return 0;
    pinned = owner;
  }
  for (int i = 0; i < m->n_layers; i++) {
    size_t lo = 0, hi = 0;
    if (!layer_span(&m->layers[i], &lo, &hi)) continue;
    if (i == pinned) {
      *pin_lo = lo;
      *pin_len = hi - lo;
    } else if (hi - lo > *cap) {
      *cap = hi - lo;
    }
  }
  return 1;
}

/* The window onto the highest layer below `below` with parameters that are not pinned,
 * cleared. */
static pmap_status window_to(const pmap_model *m, replica *r, int below) {
  for (int j = below - 1; j >= 0; j--) {
    size_t lo = 0, hi = 0;
    if (!layer_span(&m->layers[j], &lo, &hi) || (r->gpin_len && lo == r->gpin_lo)) continue;
    r->gwin_lo = lo;
    return r->ops->fill(r->q, r->gwin, 0.0f, hi - lo);
  }
  return PMAP_SUCCESS;
}

/* Adds the square of src's norm (count values) into r->gsq, through the tail's part slot
 * (zero outside the reduction, and zero again after). */
static pmap_status add_square(pmap_device *dev, const pmap_params *p, replica *r, const float *src,
                              size_t count) {
  float *slot = replica_g(r, p->gl.part), norm = 0.0f;
  PMAP_TRY(r->ops->norm2(r->q, src, count, slot));
  PMAP_TRY(backend_download(dev, &norm, slot, sizeof norm));
  r->gsq += (double)norm * (double)norm;
  return r->ops->fill(r->q, slot, 0.0f, 1);
}

/* The piece [lo, lo + count) of the flat layout, held in src, reduced (mean) into this
 * device's elements of it at dst (which holds the layout from dst_lo on). */
static pmap_status reduce_piece(pmap_device *dev, const pmap_params *p, replica *r, float *src,
                                size_t lo, size_t count, float *dst, size_t dst_lo) {
  int taken = 0;
  size_t chunk = p->gl.chunk;
  PMAP_TRY(backend_reduce_part(dev, "pmap_update's gradient reduce-scatter", src, lo, count, chunk,
                               dst, dst_lo, PMAP_RED_MEAN, &taken));
  if (taken) return PMAP_SUCCESS;
  /* An all-reduce of the piece stood in: this device's elements are copied out of it. */
  size_t a = (size_t)pmap_axis_index(dev) * chunk, b = a + chunk;
  a = a > lo ? a : lo;
  b = b < lo + count ? b : lo + count;
  if (b <= a || src + (a - lo) == dst + (a - dst_lo)) return PMAP_SUCCESS;
  return r->ops->copy(r->q, src + (a - lo), dst + (a - dst_lo), b - a);
}

/* model_backward's hook after layer i: its gradients are complete. */
static pmap_status layer_done(pmap_device *dev, replica *r, int i, void *user) {
  pmap_params *p = user;
  const pmap_model *m = p->model;
  size_t lo = 0, hi = 0;
  if (!layer_span(&m->layers[i], &lo, &hi)) return PMAP_SUCCESS;
  int pinned = r->gpin_len && lo == r->gpin_lo;
  float *src = pinned ? r->gpin : r->gwin;
  if (r->gsq_on) PMAP_TRY(add_square(dev, p, r, src, hi - lo));
  PMAP_TRY(reduce_piece(dev, p, r, src, lo, hi - lo, r->gp, r->gp_lo));
  if (pinned) {
    r->gpin_done = 1;
    return PMAP_SUCCESS;
  }
  return window_to(m, r, i);
}

pmap_status grad_window_begin(pmap_params *p, replica *r, int sumsq) {
  r->gpin_done = 0;
  r->gsq_on = sumsq;
  r->gsq = 0.0;
  r->layer_grads_done = layer_done;
  r->layer_grads_user = p;
  return window_to(p->model, r, p->model->n_layers);
}

pmap_status grad_window_finish(pmap_device *dev, pmap_params *p, replica *r) {
  /* A backward pass that stopped above the pinned layer (no layer below needed an input
   * gradient) still has the pinned range to reduce; the layers it did not reach added nothing,
   * and their parts hold the zeros a reduction of zeros would give. */
  if (r->gpin_len && !r->gpin_done) {
    if (r->gsq_on) PMAP_TRY(add_square(dev, p, r, r->gpin, r->gpin_len));
    PMAP_TRY(reduce_piece(dev, p, r, r->gpin, r->gpin_lo, r->gpin_len, r->gp, r->gp_lo));
    r->gpin_done = 1;
  }
  if (r->gsq_on) PMAP_TRY(add_square(dev, p, r, replica_g(r, p->gl.loss), 1));
  r->layer_grads_done = NULL;
  /* The tail in place: each device writes only the elements of its own part, which the others
   * do not read. */
  size_t P = p->n_params;
  return reduce_piece(dev, p, r, r->gt, P, p->gl.reduced - P, r->gt, P);
}

float grad_window_flag(const replica *r) { return (float)sqrt(r->gsq); }
