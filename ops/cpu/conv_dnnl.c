/* conv_dnnl.c: the CPU convolutions on oneDNN's primitives (forward, backward data, backward
 * weights), made once per shape and rows in the queue's cache (cpu_cache.h) and run
 * single-threaded on the calling thread, in layouts of oneDNN's choice, on pieces of the rows
 * (CPU_CONV_PIECE_BYTES) so that the workspace does not grow with the batch. Activations stay NCHW:
 * the input is reordered into the primitive's layout, the output leaves it through
 * conv_layout.c's loop, which applies the ReLU on the way (pmap_relu, which passes NaN on, where
 * oneDNN's eltwise post-op maps it to 0), and the output gradient enters it through the loop
 * that applies the ReLU's gradient. The weight gradient is added to dw by a reorder with a sum
 * post-op, the bias gradient to db by a loop. */
#include "conv.h"

#if !defined(PMAP_CONV_DNNL)

pmap_status conv_dnnl_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                              const float *w, const float *b, int relu, float *y, int *done) {
  (void)q, (void)s, (void)bd, (void)x, (void)w, (void)b, (void)relu, (void)y;
  *done = 0;
  return PMAP_SUCCESS;
}

pmap_status conv_dnnl_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                               const float *w, const float *y, const float *dy, float *dx,
                               float *dw, float *db, int *done) {
  (void)q, (void)s, (void)bd, (void)x, (void)w, (void)y, (void)dy, (void)dx, (void)dw, (void)db;
  *done = 0;
  return PMAP_SUCCESS;
}

int conv_dnnl_serves(op_queue *q, const pmap_conv_shape *s, int64_t bd) {
  (void)q, (void)s, (void)bd;
  return 0;
}

pmap_status conv_dnnl_kinds(op_queue *q, const pmap_conv_shape *s, int64_t bd, int bias,
                            int *kinds) {
  (void)q, (void)s, (void)bd, (void)bias;
  *kinds = 0;
  return PMAP_SUCCESS;
}

int64_t conv_dnnl_piece_rows(const pmap_conv_shape *s, int64_t bd) {
  (void)s;
  return bd;
}

#else

#include <dnnl.h>
#include <dnnl_debug.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cpu_cache.h"
#include "cpu_isa.h"

/* One engine for the process (an engine may be shared by threads); each entry has a stream. */
static dnnl_engine_t engine;
static dnnl_status_t engine_status = dnnl_runtime_error;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static void engine_make(void) {
  (void)cpu_isa_active(); /* oneDNN's cap is set before its first call */
  engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
}

/* oneDNN's parallel regions take the calling thread's OpenMP count: one thread, as every
 * device's GEMM (the devices are the parallelism, and the bits then do not depend on the
 * machine's core count). Set around each call, so that a caller without a queue (tests, host
 * replicas) runs as a device does, and given back after. */
static int threads_pin(void) {
  int old = omp_get_max_threads();
  if (old != 1) omp_set_num_threads(1);
  return old;
}
static void threads_restore(int old) {
  if (old != 1) omp_set_num_threads(old);
}

/* The workspace's regions: the input (and its gradient) in the primitive's layout, the output
 * (and its gradient), the weights for forward and for backward data, the weight and bias
 * gradients, and the scratchpad every primitive of the entry shares in turn. */
enum { WS_SRC, WS_DST, WS_WFWD, WS_WBWD, WS_DW, WS_DB, WS_SCRATCH, WS_N };

/* A primitive with its descriptor, made at its first use (conv) or with the entry (reorders),
 * and its scratchpad's memory object (NULL when it needs none). */
typedef struct prim {
  dnnl_primitive_desc_t pd;
  dnnl_primitive_t p;
  dnnl_memory_t scratch;
} prim;

/* A reorder between two memory objects; p.p NULL: the layouts are the same, none needed. */
typedef struct reorder {
  prim p;
  dnnl_memory_t from, to;
} reorder;

typedef struct dconv {
  int usable; /* 0: the im2col path serves this shape */
  int kinds;  /* CONV_DNNL_SERVED and the CONV_DNNL_REF_* bits (conv.h) */
  conv_layout src, dst;
  dnnl_stream_t stream;
  prim fwd, bwd_data, bwd_weights;
  reorder x_in, dx_out, w_fwd, w_bwd, dw_out;
  /* The conv primitives' operands, pointed at the right buffer before each run. */
  dnnl_memory_t src_m, dst_m, wfwd_m, wbwd_m, dw_m, bias_m, db_m;
  size_t off[WS_N], ws_bytes;
} dconv;

static void prim_free(prim *p) {
  if (p->p) dnnl_primitive_destroy(p->p);
  if (p->pd) dnnl_primitive_desc_destroy(p->pd);
  if (p->scratch) dnnl_memory_destroy(p->scratch);
}

static void mem_free(dnnl_memory_t m) {
  if (m) dnnl_memory_destroy(m);
}

static void dconv_free(void *entry) {
  dconv *d = entry;
  prim_free(&d->fwd);
  prim_free(&d->bwd_data);
  prim_free(&d->bwd_weights);
  reorder *r[] = {&d->x_in, &d->dx_out, &d->w_fwd, &d->w_bwd, &d->dw_out};
  for (int i = 0; i < 5; i++) {
    prim_free(&r[i]->p);
    mem_free(r[i]->from);
    mem_free(r[i]->to);
  }
  dnnl_memory_t m[] = {d->src_m, d->dst_m, d->wfwd_m, d->wbwd_m, d->dw_m, d->bias_m, d->db_m};
  for (int i = 0; i < 7; i++) mem_free(m[i]);
  if (d->stream) dnnl_stream_destroy(d->stream);
  free(d);
}

/* A oneDNN failure as pmap's: out of memory, or a device error naming what failed. */
static pmap_status dnnl_fail(dnnl_status_t st, const char *what, const pmap_conv_shape *s,
                             int64_t bd) {
  pmap_status code = st == dnnl_out_of_memory ? PMAP_ERR_OUT_OF_MEMORY : PMAP_ERR_DEVICE;
  return PMAP_ERR(code,
                  "conv2d (%lld x %lld x %lld x %lld -> %lld channels, kernel %dx%d, stride %d, "
                  "pad %d): oneDNN's %s failed: %s",
                  (long long)bd, (long long)s->c, (long long)s->h, (long long)s->w,
                  (long long)s->oc, s->kh, s->kw, s->stride, s->pad, what, dnnl_status2str(st));
}

#define DNNL_TRY(call, what)                                               \
  do {                                                                     \
    dnnl_status_t dnnl_st_ = (call);                                       \
    if (dnnl_st_ != dnnl_success) return dnnl_fail(dnnl_st_, what, s, bd); \
  } while (0)

/* The layout of md (dims n, c, h, w) when it is one conv_layout.c reads: dense NCHW, or dense
 * with the channels in blocks of 4, 8 or 16 (strides of axes of size 1 do not matter). */
static int layout_of(const dnnl_memory_desc_t *md, conv_layout *l) {
  if (md->ndims != 4 || md->format_kind != dnnl_blocked || md->data_type != dnnl_f32 ||
      md->offset0 != 0)
    return 0;
  const dnnl_blocking_desc_t *bk = &md->format_desc.blocking;
  int64_t n = md->dims[0], c = md->dims[1], h = md->dims[2], w = md->dims[3];
  int64_t b = 1;
  if (bk->inner_nblks == 1 && bk->inner_idxs[0] == 1)
    b = bk->inner_blks[0];
  else if (bk->inner_nblks != 0)
    return 0;
  if (b != 1 && b != 4 && b != 8 && b != 16) return 0;
  int64_t cp = (c + b - 1) / b * b;
  const int64_t want[4] = {cp * h * w, h * w * b, w * b, b}, size[4] = {n, cp / b, h, w};
  if (md->padded_dims[0] != n || md->padded_dims[1] != cp || md->padded_dims[2] != h ||
      md->padded_dims[3] != w)
    return 0;
  for (int i = 0; i < 4; i++)
    if (size[i] > 1 && bk->strides[i] != want[i]) return 0;
  *l = (conv_layout){.n = n, .c = c, .hw = h * w, .block = (int)b};
  return 1;
}

/* A user-managed scratchpad: a primitive then runs on any thread, with the entry's region. */
static dnnl_status_t attr_make(dnnl_primitive_attr_t *attr, int sum) {
  dnnl_status_t st = dnnl_primitive_attr_create(attr);
  if (st == dnnl_success)
    st = dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user);
  if (st != dnnl_success || !sum) return st;
  dnnl_post_ops_t po = NULL;
  st = dnnl_post_ops_create(&po);
  if (st == dnnl_success) st = dnnl_post_ops_append_sum(po, 1.0f);
  if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(*attr, po);
  if (po) dnnl_post_ops_destroy(po);
  return st;
}

static const dnnl_memory_desc_t *md_of(const prim *p, dnnl_query_t what) {
  return dnnl_primitive_desc_query_md(p->pd, what, 0);
}

static size_t md_bytes(const dnnl_memory_desc_t *md) { return dnnl_memory_desc_get_size(md); }

/* p's scratchpad memory object, where it needs one; *bytes grows to its size. */
static dnnl_status_t scratch_make(prim *p, size_t *bytes) {
  const dnnl_memory_desc_t *md = md_of(p, dnnl_query_scratchpad_md);
  size_t n = md ? md_bytes(md) : 0;
  if (n > *bytes) *bytes = n;
  return n ? dnnl_memory_create(&p->scratch, md, engine, DNNL_MEMORY_NONE) : dnnl_success;
}

/* A reorder from one layout to another (sum: adds into the destination); none when they are
 * the same and nothing is added. */
static dnnl_status_t reorder_make(reorder *r, const dnnl_memory_desc_t *from,
                                  const dnnl_memory_desc_t *to, int sum, size_t *scratch) {
  if (!sum && dnnl_memory_desc_equal(from, to)) return dnnl_success;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_status_t st = attr_make(&attr, sum);
  if (st == dnnl_success)
    st = dnnl_reorder_primitive_desc_create(&r->p.pd, from, engine, to, engine, attr);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (st == dnnl_success) st = dnnl_primitive_create(&r->p.p, r->p.pd);
  if (st == dnnl_success) st = scratch_make(&r->p, scratch);
  if (st == dnnl_success) st = dnnl_memory_create(&r->from, from, engine, DNNL_MEMORY_NONE);
  if (st == dnnl_success) st = dnnl_memory_create(&r->to, to, engine, DNNL_MEMORY_NONE);
  return st;
}

/* The three descriptors, in layouts of oneDNN's choice for the forward and the same activation
 * layouts for the backward passes. dnnl_unimplemented: no implementation serves the shape. The
 * far side's padding is what the last window hangs over: less than pad (negative where the
 * stride leaves the last rows unread). */
static dnnl_status_t descs_make(dconv *d, const pmap_conv_shape *s, int64_t bd, int bias,
                                const dnnl_memory_desc_t *bm) {
  dnnl_memory_desc_t xa, wa, ya;
  dnnl_dims_t xd = {bd, s->c, s->h, s->w}, wd = {s->oc, s->c, s->kh, s->kw},
              yd = {bd, s->oc, s->oh, s->ow};
  dnnl_memory_desc_init_by_tag(&xa, 4, xd, dnnl_f32, dnnl_format_tag_any);
  dnnl_memory_desc_init_by_tag(&wa, 4, wd, dnnl_f32, dnnl_format_tag_any);
  dnnl_memory_desc_init_by_tag(&ya, 4, yd, dnnl_f32, dnnl_format_tag_any);
  dnnl_dims_t st = {s->stride, s->stride}, pl = {s->pad, s->pad},
              pr = {(s->oh - 1) * s->stride + s->kh - s->h - s->pad,
                    (s->ow - 1) * s->stride + s->kw - s->w - s->pad};
  dnnl_convolution_desc_t fd, bdd, bwd;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_status_t r = attr_make(&attr, 0);
  if (r == dnnl_success)
    r = dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &xa,
                                           &wa, bias ? bm : NULL, &ya, st, pl, pr);
  if (r == dnnl_success) r = dnnl_primitive_desc_create(&d->fwd.pd, &fd, attr, engine, NULL);
  const dnnl_memory_desc_t *src = r == dnnl_success ? md_of(&d->fwd, dnnl_query_src_md) : NULL;
  const dnnl_memory_desc_t *dst = r == dnnl_success ? md_of(&d->fwd, dnnl_query_dst_md) : NULL;
  if (r == dnnl_success)
    r = dnnl_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, src, &wa, dst, st,
                                                 pl, pr);
  if (r == dnnl_success)
    r = dnnl_primitive_desc_create(&d->bwd_data.pd, &bdd, attr, engine, d->fwd.pd);
  if (r == dnnl_success)
    r = dnnl_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, src, &wa,
                                                    bias ? bm : NULL, dst, st, pl, pr);
  if (r == dnnl_success)
    r = dnnl_primitive_desc_create(&d->bwd_weights.pd, &bwd, attr, engine, d->fwd.pd);
  if (attr) dnnl_primitive_attr_destroy(attr);
  return r;
}

/* Whether oneDNN serves p with its reference implementation ("ref:any"): plain loops, for shapes
 * its optimized kernels do not take, hundreds of times slower than im2col's GEMMs. */
static int is_reference(const prim *p) {
  const char *impl = NULL;
  if (dnnl_primitive_desc_query(p->pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success)
    return 0;
  return impl && strncmp(impl, "ref", 3) == 0;
}

/* The entry of (s, bd, bias): its descriptors, reorders, operands and workspace plan; usable 0
 * where oneDNN has no implementation, or chose a layout conv_layout.c does not read or one that
 * pads the channels to more than twice their count. */
static pmap_status dconv_make(const pmap_conv_shape *s, int64_t bd, int bias, dconv **out) {
  dconv *d = calloc(1, sizeof *d);
  if (!d) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "conv2d: out of memory for its primitives");
  *out = d;
  dnnl_memory_desc_t xm, wm, bm;
  dnnl_dims_t xd = {bd, s->c, s->h, s->w}, wd = {s->oc, s->c, s->kh, s->kw}, bdim = {s->oc};
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&xm, 4, xd, dnnl_f32, dnnl_nchw), "memory descriptor");
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&wm, 4, wd, dnnl_f32, dnnl_oihw), "memory descriptor");
  DNNL_TRY(dnnl_memory_desc_init_by_tag(&bm, 1, bdim, dnnl_f32, dnnl_x), "memory descriptor");
  /* No implementation (or a refusal of the shape): the im2col path serves it. */
  dnnl_status_t st = descs_make(d, s, bd, bias, &bm);
  if (st != dnnl_success && st != dnnl_out_of_memory) return PMAP_SUCCESS;
  DNNL_TRY(st, "convolution descriptors");
  const dnnl_memory_desc_t *src = md_of(&d->fwd, dnnl_query_src_md),
                           *dst = md_of(&d->fwd, dnnl_query_dst_md);
  /* A layout that pads the channels to more than twice their count (one output channel in a
   * block of 16) does that much more work than im2col's GEMMs: those serve the shape. */
  if (!layout_of(src, &d->src) || !layout_of(dst, &d->dst) || 2 * s->c < d->src.block ||
      2 * s->oc < d->dst.block ||
      !dnnl_memory_desc_equal(src, md_of(&d->bwd_data, dnnl_query_diff_src_md)) ||
      !dnnl_memory_desc_equal(dst, md_of(&d->bwd_data, dnnl_query_diff_dst_md)) ||
      !dnnl_memory_desc_equal(src, md_of(&d->bwd_weights, dnnl_query_src_md)) ||
      !dnnl_memory_desc_equal(dst, md_of(&d->bwd_weights, dnnl_query_diff_dst_md)))
    return PMAP_SUCCESS;
  const dnnl_memory_desc_t *wf = md_of(&d->fwd, dnnl_query_weights_md),
                           *wb = md_of(&d->bwd_data, dnnl_query_weights_md),
                           *dwm = md_of(&d->bwd_weights, dnnl_query_diff_weights_md);
  size_t scratch = 0;
  DNNL_TRY(scratch_make(&d->fwd, &scratch), "scratchpad");
  DNNL_TRY(scratch_make(&d->bwd_data, &scratch), "scratchpad");
  DNNL_TRY(scratch_make(&d->bwd_weights, &scratch), "scratchpad");
  DNNL_TRY(reorder_make(&d->x_in, &xm, src, 0, &scratch), "input reorder");
  DNNL_TRY(reorder_make(&d->dx_out, src, &xm, 0, &scratch), "input gradient reorder");
  DNNL_TRY(reorder_make(&d->w_fwd, &wm, wf, 0, &scratch), "weights reorder");
  DNNL_TRY(reorder_make(&d->w_bwd, &wm, wb, 0, &scratch), "weights reorder");
  DNNL_TRY(reorder_make(&d->dw_out, dwm, &wm, 1, &scratch), "weight gradient reorder");
  dnnl_memory_t *m[] = {&d->src_m, &d->dst_m,  &d->wfwd_m, &d->wbwd_m,
                        &d->dw_m,  &d->bias_m, &d->db_m};
  const dnnl_memory_desc_t *mds[] = {src, dst, wf, wb, dwm, &bm, &bm};
  for (int i = 0; i < 7; i++)
    DNNL_TRY(dnnl_memory_create(m[i], mds[i], engine, DNNL_MEMORY_NONE), "memory object");
  DNNL_TRY(dnnl_stream_create(&d->stream, engine, dnnl_stream_default_flags), "stream");
  const size_t need[WS_N] = {d->x_in.p.p || d->dx_out.p.p ? md_bytes(src) : 0,
                             md_bytes(dst),
                             d->w_fwd.p.p ? md_bytes(wf) : 0,
                             d->w_bwd.p.p ? md_bytes(wb) : 0,
                             md_bytes(dwm),
                             bias ? (size_t)s->oc * sizeof(float) : 0,
                             scratch};
  for (int i = 0; i < WS_N; i++) {
    d->off[i] = d->ws_bytes;
    d->ws_bytes += (need[i] + 63) / 64 * 64;
  }
  d->usable = 1;
  d->kinds = CONV_DNNL_SERVED | (is_reference(&d->fwd) ? CONV_DNNL_REF_FORWARD : 0) |
             (is_reference(&d->bwd_data) ? CONV_DNNL_REF_DATA : 0) |
             (is_reference(&d->bwd_weights) ? CONV_DNNL_REF_WEIGHTS : 0);
  return PMAP_SUCCESS;
}

/* The entry of (s, bd, bias) in q's cache, made at its first use. */
static pmap_status entry_of(op_queue *q, const pmap_conv_shape *s, int64_t bd, int bias,
                            dconv **out, char **ws) {
  *out = NULL;
  pthread_once(&engine_once, engine_make);
  if (engine_status != dnnl_success) return PMAP_SUCCESS; /* no CPU engine: the im2col path */
  cpu_cache *c = cpu_cache_of(q);
  if (!c) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "conv2d: out of memory for its cache");
  cpu_cache_key key = {.kind = CPU_CACHE_CONV, .dtype = PMAP_F32, .flags = bias};
  const int64_t dims[] = {bd,    s->c,  s->h,  s->w,      s->oc, s->oh,
                          s->ow, s->kh, s->kw, s->stride, s->pad};
  memcpy(key.dims, dims, sizeof dims);
  dconv *d = cpu_cache_find(c, &key);
  if (!d) {
    pmap_status st = dconv_make(s, bd, bias, &d);
    if (st) {
      if (d) dconv_free(d);
      return st;
    }
    PMAP_TRY(cpu_cache_add(c, &key, d, dconv_free));
  }
  if (!d->usable) return PMAP_SUCCESS;
  void *w = NULL;
  PMAP_TRY(cpu_cache_workspace(c, d->ws_bytes, "conv2d", &w));
  *out = d;
  *ws = w;
  return PMAP_SUCCESS;
}

static dnnl_status_t handle(dnnl_memory_t m, const void *p) {
  return dnnl_memory_set_data_handle_v2(m, (void *)p, NULL);
}

/* Runs p (made now at its first use) with args and its scratchpad in ws. */
static dnnl_status_t run(dconv *d, prim *p, dnnl_exec_arg_t *args, int nargs, char *ws) {
  dnnl_status_t st = p->p ? dnnl_success : dnnl_primitive_create(&p->p, p->pd);
  if (st != dnnl_success) return st;
  if (p->scratch) {
    st = handle(p->scratch, ws + d->off[WS_SCRATCH]);
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, p->scratch};
  }
  if (st == dnnl_success) st = dnnl_primitive_execute(p->p, d->stream, nargs, args);
  return st;
}

/* from -> to through r, or *to = from where no reorder is needed. */
static dnnl_status_t reorder_run(dconv *d, reorder *r, const void *from, void *to, char *ws) {
  if (!r->p.p) return dnnl_success;
  dnnl_status_t st = handle(r->from, from);
  if (st == dnnl_success) st = handle(r->to, to);
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_FROM, r->from}, {DNNL_ARG_TO, r->to}};
  if (st == dnnl_success) st = run(d, &r->p, args, 2, ws);
  return st;
}

static pmap_status forward(dconv *d, char *ws, const pmap_conv_shape *s, int64_t bd, const float *x,
                           const float *w, const float *b, int relu, float *y) {
  const void *src = d->x_in.p.p ? ws + d->off[WS_SRC] : (const void *)x;
  const void *wf = d->w_fwd.p.p ? ws + d->off[WS_WFWD] : (const void *)w;
  float *dst = d->dst.block > 1 ? (float *)(ws + d->off[WS_DST]) : y;
  DNNL_TRY(reorder_run(d, &d->x_in, x, ws + d->off[WS_SRC], ws), "input reorder");
  DNNL_TRY(reorder_run(d, &d->w_fwd, w, ws + d->off[WS_WFWD], ws), "weights reorder");
  DNNL_TRY(handle(d->src_m, src), "memory handle");
  DNNL_TRY(handle(d->wfwd_m, wf), "memory handle");
  DNNL_TRY(handle(d->dst_m, dst), "memory handle");
  dnnl_exec_arg_t args[6] = {
      {DNNL_ARG_SRC, d->src_m}, {DNNL_ARG_WEIGHTS, d->wfwd_m}, {DNNL_ARG_DST, d->dst_m}};
  int nargs = 3;
  if (b) {
    DNNL_TRY(handle(d->bias_m, b), "memory handle");
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, d->bias_m};
  }
  DNNL_TRY(run(d, &d->fwd, args, nargs, ws), "forward convolution");
  DNNL_TRY(dnnl_stream_wait(d->stream), "stream");
  if (relu || dst != y) conv_unblock(&d->dst, dst, relu, y);
  return PMAP_SUCCESS;
}

static pmap_status backward(dconv *d, char *ws, const pmap_conv_shape *s, int64_t bd,
                            const float *x, const float *w, const float *y, const float *dy,
                            float *dx, float *dw, float *db) {
  /* The output gradient through the ReLU, in the primitives' layout. */
  const float *g = dy;
  if (y || d->dst.block > 1) {
    float *gb = (float *)(ws + d->off[WS_DST]);
    conv_block_grad(&d->dst, y, dy, gb);
    g = gb;
  }
  const void *src = d->x_in.p.p ? ws + d->off[WS_SRC] : (const void *)x;
  float *dwb = (float *)(ws + d->off[WS_DW]), *dbb = (float *)(ws + d->off[WS_DB]);
  DNNL_TRY(reorder_run(d, &d->x_in, x, ws + d->off[WS_SRC], ws), "input reorder");
  DNNL_TRY(handle(d->src_m, src), "memory handle");
  DNNL_TRY(handle(d->dst_m, g), "memory handle");
  DNNL_TRY(handle(d->dw_m, dwb), "memory handle");
  dnnl_exec_arg_t args[6] = {
      {DNNL_ARG_SRC, d->src_m}, {DNNL_ARG_DIFF_DST, d->dst_m}, {DNNL_ARG_DIFF_WEIGHTS, d->dw_m}};
  int nargs = 3;
  if (db) {
    DNNL_TRY(handle(d->db_m, dbb), "memory handle");
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_BIAS, d->db_m};
  }
  DNNL_TRY(run(d, &d->bwd_weights, args, nargs, ws), "weight gradient convolution");
  DNNL_TRY(reorder_run(d, &d->dw_out, dwb, dw, ws), "weight gradient reorder");
  if (dx) {
    const void *wb = d->w_bwd.p.p ? ws + d->off[WS_WBWD] : (const void *)w;
    void *dsrc = d->dx_out.p.p ? ws + d->off[WS_SRC] : (void *)dx;
    DNNL_TRY(reorder_run(d, &d->w_bwd, w, ws + d->off[WS_WBWD], ws), "weights reorder");
    DNNL_TRY(handle(d->wbwd_m, wb), "memory handle");
    DNNL_TRY(handle(d->src_m, dsrc), "memory handle");
    dnnl_exec_arg_t dargs[4] = {{DNNL_ARG_DIFF_DST, d->dst_m},
                                {DNNL_ARG_WEIGHTS, d->wbwd_m},
                                {DNNL_ARG_DIFF_SRC, d->src_m}};
    DNNL_TRY(run(d, &d->bwd_data, dargs, 3, ws), "input gradient convolution");
    DNNL_TRY(reorder_run(d, &d->dx_out, dsrc, dx, ws), "input gradient reorder");
  }
  DNNL_TRY(dnnl_stream_wait(d->stream), "stream");
  for (int64_t o = 0; db && o < s->oc; o++) db[o] += dbb[o];
  return PMAP_SUCCESS;
}

/* The pieces the rows of a call are cut into, so that the workspace stays within about
 * CPU_CONV_PIECE_BYTES whatever the batch: as many rows as keep a piece's input and output (their
 * channels padded to 16, as the blocked layouts may) within it, one at least, the pieces as equal
 * as they can be: `big` pieces of base + 1 rows first, then pieces of base rows (at most two
 * entries in the cache per layer and rows per device; bd >= 1). A piece's weight and bias
 * gradients add to dw and db as the whole batch's would, in the pieces' order. */
typedef struct pieces {
  int64_t count, base, big;
} pieces;

static pieces pieces_of(const pmap_conv_shape *s, int64_t bd) {
  double row = (double)sizeof(float) * ((double)((s->c + 15) / 16 * 16) * (double)(s->h * s->w) +
                                        (double)((s->oc + 15) / 16 * 16) * (double)(s->oh * s->ow));
  double fit = row > 0 ? (double)CPU_CONV_PIECE_BYTES / row : (double)bd;
  int64_t most = fit >= (double)bd ? bd : fit >= 1.0 ? (int64_t)fit : 1;
  pieces p = {.count = (bd + most - 1) / most};
  p.base = bd / p.count;
  p.big = bd % p.count;
  return p;
}

static int64_t piece_rows(const pieces *p, int64_t i) { return p->base + (i < p->big); }

int64_t conv_dnnl_piece_rows(const pmap_conv_shape *s, int64_t bd) {
  pieces p = pieces_of(s, bd);
  return p.base + (p.big > 0);
}

/* The kinds (conv.h) of every piece's entry together (their entries made now): 0 where oneDNN
 * does not serve one of them, which sends the whole call to the im2col path before any piece
 * ran; else CONV_DNNL_SERVED with the reference bits of any piece. */
static pmap_status pieces_kinds(op_queue *q, const pmap_conv_shape *s, const pieces *p, int bias,
                                int *kinds) {
  *kinds = 0;
  int all = CONV_DNNL_SERVED;
  dconv *d = NULL;
  char *ws = NULL;
  if (p->big > 0) {
    PMAP_TRY(entry_of(q, s, p->base + 1, bias, &d, &ws));
    if (!d) return PMAP_SUCCESS;
    all |= d->kinds;
  }
  if (p->count > p->big) {
    PMAP_TRY(entry_of(q, s, p->base, bias, &d, &ws));
    if (!d) return PMAP_SUCCESS;
    all |= d->kinds;
  }
  *kinds = all;
  return PMAP_SUCCESS;
}

/* Whether oneDNN serves every piece's shape: *ok 0 sends the whole call to the im2col path. */
static pmap_status pieces_served(op_queue *q, const pmap_conv_shape *s, const pieces *p, int bias,
                                 int *ok) {
  PMAP_TRY(pieces_kinds(q, s, p, bias, ok));
  *ok = *ok != 0;
  return PMAP_SUCCESS;
}

static pmap_status forward_pieces(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                                  const float *w, const float *b, int relu, float *y, int *done) {
  pieces p = pieces_of(s, bd);
  PMAP_TRY(pieces_served(q, s, &p, b != NULL, done));
  int64_t chw = s->c * s->h * s->w, ohw = s->oc * s->oh * s->ow;
  for (int64_t i = 0, row = 0; *done && i < p.count; row += piece_rows(&p, i), i++) {
    int64_t rows = piece_rows(&p, i);
    dconv *d = NULL;
    char *ws = NULL;
    PMAP_TRY(entry_of(q, s, rows, b != NULL, &d, &ws));
    PMAP_TRY(forward(d, ws, s, rows, x + row * chw, w, b, relu, y + row * ohw));
  }
  return PMAP_SUCCESS;
}

static pmap_status backward_pieces(op_queue *q, const pmap_conv_shape *s, int64_t bd,
                                   const float *x, const float *w, const float *y, const float *dy,
                                   float *dx, float *dw, float *db, int *done) {
  pieces p = pieces_of(s, bd);
  PMAP_TRY(pieces_served(q, s, &p, db != NULL, done));
  int64_t chw = s->c * s->h * s->w, ohw = s->oc * s->oh * s->ow;
  for (int64_t i = 0, row = 0; *done && i < p.count; row += piece_rows(&p, i), i++) {
    int64_t rows = piece_rows(&p, i);
    dconv *d = NULL;
    char *ws = NULL;
    PMAP_TRY(entry_of(q, s, rows, db != NULL, &d, &ws));
    PMAP_TRY(backward(d, ws, s, rows, x + row * chw, w, y ? y + row * ohw : NULL, dy + row * ohw,
                      dx ? dx + row * chw : NULL, dw, db));
  }
  return PMAP_SUCCESS;
}

pmap_status conv_dnnl_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                              const float *w, const float *b, int relu, float *y, int *done) {
  int saved = threads_pin();
  *done = 0;
  pmap_status st = forward_pieces(q, s, bd, x, w, b, relu, y, done);
  threads_restore(saved);
  return st;
}

pmap_status conv_dnnl_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                               const float *w, const float *y, const float *dy, float *dx,
                               float *dw, float *db, int *done) {
  int saved = threads_pin();
  *done = 0;
  pmap_status st = backward_pieces(q, s, bd, x, w, y, dy, dx, dw, db, done);
  threads_restore(saved);
  return st;
}

int conv_dnnl_serves(op_queue *q, const pmap_conv_shape *s, int64_t bd) {
  int kinds = 0;
  return bd >= 1 && !conv_dnnl_kinds(q, s, bd, 1, &kinds) && kinds;
}

pmap_status conv_dnnl_kinds(op_queue *q, const pmap_conv_shape *s, int64_t bd, int bias,
                            int *kinds) {
  *kinds = 0;
  if (bd < 1) return PMAP_SUCCESS;
  int saved = threads_pin();
  pieces p = pieces_of(s, bd);
  pmap_status st = pieces_kinds(q, s, &p, bias, kinds);
  threads_restore(saved);
  return st;
}

#endif
