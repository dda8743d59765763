/* make_seeds.c: writes the seed corpus of fuzz_checkpoint from real saves: the two states the
 * target loads into (linear, SGD; mlp, Adam), trained a few steps, with and without a user
 * section. Usage: fuzz_make_seeds FOLDER. */
#include <stdio.h>
#include <string.h>

#include "pmap.h"
#include "pmap_examples.h"

static int seed_file(const char *dir, const char *name, int n, int steps, const char *user) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n};
  pmap_example_info info;
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_array xs = {0}, ys = {0};
  int bad = pmap_example_info_get(name, &info) || pmap_ctx_create(&cfg, &ctx) ||
            pmap_example_model(name, &m) || pmap_params_create(ctx, m, &info.opt, 1, &p) ||
            pmap_example_data(name, 2, 32, &xs, &ys);
  for (int s = 0; !bad && s < steps; s++) bad = pmap_update(p, &xs, &ys, NULL) != PMAP_SUCCESS;
  char path[512];
  snprintf(path, sizeof path, "%s/%s-%d%s.ckpt", dir, name, steps, user ? "-user" : "");
  if (!bad) bad = pmap_params_save_user(p, path, user, user ? strlen(user) : 0) != PMAP_SUCCESS;
  if (bad) fprintf(stderr, "fuzz_make_seeds: %s: %s\n", name, pmap_last_error());
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_make_seeds FOLDER\n");
    return 1;
  }
  int bad = seed_file(argv[1], "linear", 1, 3, "position 3");
  bad |= seed_file(argv[1], "linear", 2, 0, NULL);
  bad |= seed_file(argv[1], "mlp", 2, 2, NULL);
  bad |= seed_file(argv[1], "mlp", 1, 1, "user");
  return bad;
}
