/* conv.c: 2-D convolution (NCHW) on the CPU: the ops, which take oneDNN's primitives where the
 * build has them (conv_dnnl.c) and PMAP_CONV does not say otherwise (conv.h), and else the path
 * every build has, im2col + the GEMM in use (conv_im2col.c). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/env.h"
#include "base/error.h"
#include "conv.h"

/* ------------------------------------------------------------------------------------------ */
/* Which path                                                                                 */

enum { PATH_ONEDNN, PATH_IM2COL };
static const char *const path_names[] = {"onednn", "im2col"};

#if defined(PMAP_CONV_DNNL)
#define PATH_DEFAULT PATH_ONEDNN
#else
#define PATH_DEFAULT PATH_IM2COL
#endif

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static _Atomic int path = PATH_DEFAULT;
static pmap_status env_status;
static char env_msg[256];

/* The path `name` names into *out; a status and env_msg's text when it names none built. */
static pmap_status path_of(const char *name, const char *what, int *out) {
  if (!name || !*name || strcmp(name, "auto") == 0) {
    *out = PATH_DEFAULT;
    return PMAP_SUCCESS;
  }
  if (strcmp(name, "im2col") == 0) {
    *out = PATH_IM2COL;
    return PMAP_SUCCESS;
  }
  if (strcmp(name, "onednn") == 0) {
#if defined(PMAP_CONV_DNNL)
    *out = PATH_ONEDNN;
    return PMAP_SUCCESS;
#else
    snprintf(env_msg, sizeof env_msg,
             "%s\"%s\" asks for oneDNN's convolutions, which this build does not contain "
             "(built: %s; or auto)",
             what, name, cpu_conv_paths());
    return PMAP_ERR_UNAVAILABLE;
#endif
  }
  snprintf(env_msg, sizeof env_msg, "%s\"%s\" names no CPU convolution (built: %s; or auto)", what,
           name, cpu_conv_paths());
  return PMAP_ERR_INVALID_ARGUMENT;
}

static void read_env(void) {
  int p = PATH_DEFAULT;
  env_status = path_of(pmap_env_get("PMAP_CONV"), "environment variable PMAP_CONV=", &p);
  if (!env_status) atomic_store(&path, p);
}

pmap_status cpu_conv_ready(const char *call) {
  pthread_once(&env_once, read_env);
  if (env_status) return PMAP_ERR(env_status, "%s: %s", call, env_msg);
  return PMAP_SUCCESS;
}

pmap_status cpu_conv_force(const char *name) {
  pthread_once(&env_once, read_env);
  int p = PATH_DEFAULT;
  pmap_status st = path_of(name, "cpu_conv_force: ", &p);
  if (st) return PMAP_ERR(st, "%s", env_msg);
  env_status = PMAP_SUCCESS; /* a forced path overrides a bad PMAP_CONV */
  atomic_store(&path, p);
  return PMAP_SUCCESS;
}

const char *cpu_conv_path(void) {
  pthread_once(&env_once, read_env);
  return env_status ? "none" : path_names[atomic_load(&path)];
}

const char *cpu_conv_paths(void) {
#if defined(PMAP_CONV_DNNL)
  return "onednn,im2col";
#else
  return "im2col";
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* The ops                                                                                    */

/* Whether the convolutions take oneDNN's primitives; an invalid PMAP_CONV is an error. */
static pmap_status use_dnnl(int *yes) {
  PMAP_TRY(cpu_conv_ready("conv2d"));
  *yes = atomic_load(&path) == PATH_ONEDNN;
  return PMAP_SUCCESS;
}

pmap_status cpu_conv2d_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                               const float *w, const float *b, int relu, float *y, float *col) {
  if (bd <= 0) return PMAP_SUCCESS;
  int dnnl = 0, done = 0;
  PMAP_TRY(use_dnnl(&dnnl));
  if (dnnl) PMAP_TRY(conv_dnnl_forward(q, s, bd, x, w, b, relu, y, &done));
  if (done) return PMAP_SUCCESS;
  return conv_im2col_forward(q, s, bd, x, w, b, relu, y, col);
}

pmap_status cpu_conv2d_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                                const float *w, const float *y, const float *dy, float *dx,
                                float *dw, float *db, float *col, float *dcol) {
  if (bd <= 0) return PMAP_SUCCESS;
  int dnnl = 0, done = 0;
  PMAP_TRY(use_dnnl(&dnnl));
  if (dnnl) PMAP_TRY(conv_dnnl_backward(q, s, bd, x, w, y, dy, dx, dw, db, &done));
  if (done) return PMAP_SUCCESS;
  return conv_im2col_backward(q, s, bd, x, w, y, dy, dx, dw, db, col, dcol);
}
