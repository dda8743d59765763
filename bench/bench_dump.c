/* bench_dump.c: pmap-bench --dump DIR writes what a peer framework needs to train the same model
 * from the same start: the architecture, the parameters' blocks and the optimizer (JSON), the
 * initial parameters and the global batch (raw little-endian arrays: x.f32 holds int32 token ids
 * where x_dtype says so). bench/jax_compare.py and bench/torch_peer.py read them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench.h"
#include "models/model.h"

static int write_raw(const char *dir, const char *model, const char *ext, const void *data,
                     size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.%s", dir, model, ext);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(data, 1, bytes, f) == bytes;
  if (f && fclose(f)) ok = 0;
  if (!ok) fprintf(stderr, "pmap-bench: --dump: cannot write %s\n", path);
  return ok ? 0 : -1;
}

/* Each layer as its class describes it (models/layer.h describe): {"kind": ..., settings}. */
static void json_layers(FILE *f, const pmap_model *m) {
  for (int i = 0; i < m->n_layers; i++) {
    fprintf(f, "%s", i ? ", " : "");
    layer_describe(&m->layers[i], f);
  }
}

/* The flat vector's blocks as the layers declare them (pmap_model_param_block): what
 * bench/jax_compare.py maps the parameters by. */
static void json_blocks(FILE *f, const pmap_model *m) {
  pmap_param_block b;
  for (size_t k = 0; pmap_model_param_block(m, k, &b) == PMAP_SUCCESS; k++) {
    fprintf(f, "%s{\"name\": \"%s\", \"layer\": %d, \"block\": \"%s\", \"shape\": [", k ? ", " : "",
            b.name, b.layer, b.block);
    for (int a = 0; a < b.rank; a++) fprintf(f, "%s%lld", a ? ", " : "", (long long)b.shape[a]);
    fprintf(f, "], \"offset\": %zu, \"count\": %zu, \"trained\": %s}", b.offset, b.count,
            b.trained ? "true" : "false");
  }
}

int bench_dump(const char *dir, const char *name, const pmap_model *m, const pmap_optimizer *opt,
               uint64_t seed, const pmap_array *xs, const pmap_array *ys) {
  if (mkdir(dir, 0777) && errno != EEXIST) {
    fprintf(stderr, "pmap-bench: --dump: cannot create %s\n", dir);
    return -1;
  }
  float *w = malloc(m->n_params * sizeof *w);
  if (!w) {
    fprintf(stderr, "pmap-bench: out of memory\n");
    return -1;
  }
  /* The draw pmap_params_create makes from the same seed. */
  model_init_params(m, seed, w);
  int rc = write_raw(dir, name, "params.f32", w, m->n_params * sizeof *w);
  free(w);
  if (!rc) rc = write_raw(dir, name, "x.f32", xs->data, (size_t)pmap_array_numel(xs) * 4);
  if (!rc) rc = write_raw(dir, name, "y.bin", ys->data, (size_t)pmap_array_numel(ys) * 4);
  if (rc) return rc;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.json", dir, name);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "pmap-bench: --dump: cannot write %s\n", path);
    return -1;
  }
  fprintf(f, "{\"model\": \"%s\", \"seed\": %llu, \"params\": %zu, \"input_shape\": [", name,
          (unsigned long long)seed, m->n_params);
  for (int i = 0; i < m->in_rank; i++)
    fprintf(f, "%s%lld", i ? ", " : "", (long long)m->in_shape[i]);
  fprintf(f, "], \"batch\": %lld, \"x_dtype\": \"%s\", \"x_shape\": [", (long long)xs->shape[0],
          xs->dtype == PMAP_I32 ? "int32" : "float32");
  for (int i = 0; i < xs->rank; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)xs->shape[i]);
  fprintf(f, "], \"y_dtype\": \"%s\", \"y_shape\": [", ys->dtype == PMAP_I32 ? "int32" : "float32");
  for (int i = 0; i < ys->rank; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)ys->shape[i]);
  fprintf(f, "], \"loss\": \"%s\", \"layers\": [",
          m->loss == PMAP_LOSS_MSE          ? "mse"
          : m->loss == PMAP_LOSS_TOKEN_XENT ? "token_xent"
                                            : "softmax_xent");
  json_layers(f, m);
  fprintf(f, "], \"blocks\": [");
  json_blocks(f, m);
  fprintf(f,
          "], \"optimizer\": {\"kind\": \"%s\", \"lr\": %.9g, \"momentum\": %.9g, "
          "\"beta1\": %.9g, \"beta2\": %.9g, \"eps\": %.9g}}\n",
          opt->kind == PMAP_OPT_ADAM ? "adam" : "sgd", (double)opt->lr, (double)opt->momentum,
          (double)opt->beta1, (double)opt->beta2, (double)opt->eps);
  if (fclose(f)) {
    fprintf(stderr, "pmap-bench: --dump: cannot write %s\n", path);
    return -1;
  }
  return 0;
}
