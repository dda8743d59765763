/* test_verify.c: pmap_params_verify passes on identical replicas (1..4 devices, with and without
 * optimizer state, before and after training and a load, replicated and sharded optimizer) and
 * names the drifted device when the fault injection PMAP_FAULT=drift:device=1:step=3 perturbs
 * device 1's replica after step 3, or when the test itself flips one bit of a replica's
 * parameters or (replicated) optimizer state (white box: CPU device memory is host memory,
 * reached through the inside of pmap_params). With a sharded optimizer the state is not
 * compared (each device holds a different part), and the next step's all-gather of the
 * parameters makes a drifted replica whole again. */
#include "ckpt_util.h"
#include "models/params.h"

/* Flips the lowest mantissa bit of x[i] (CPU device memory). */
static void flip(float *x, size_t i) {
  uint32_t v;
  memcpy(&v, &x[i], 4);
  v ^= 1u;
  memcpy(&x[i], &v, 4);
}

/* The optimizer replicated (0) or sharded (1), from the next context created on. */
static void sharded(int on) { setenv("PMAP_SHARD_OPTIMIZER", on ? "1" : "0", 1); }

static void poked(void) {
  state s;
  sharded(0);
  if (state_open(&s, "mlp", 4, NULL, 2, 64, 256)) return;
  CHECK(!s.params->shard, "PMAP_SHARD_OPTIMIZER=0 replicates the optimizer");
  state_train(&s, 0, 3, NULL);
  size_t P = pmap_params_count(s.params);
  flip(s.params->rep[2].w, P - 1);
  CHECK_FAILS(pmap_params_verify(s.params), PMAP_ERR_DEVICE, "1 of 4 replicas differ");
  CHECK(strstr(pmap_last_error(), "device 2 (") && strstr(pmap_last_error(), "after step 3"),
        "names device 2 and the step: %s", pmap_last_error());
  flip(s.params->rep[2].w, P - 1);
  CHECK_OK(pmap_params_verify(s.params));
  /* The optimizer state: Adam's second moment, on two devices. */
  flip(s.params->rep[1].opt, 2 * P - 1);
  flip(s.params->rep[3].opt, 0);
  CHECK_FAILS(pmap_params_verify(s.params), PMAP_ERR_DEVICE, "2 of 4 replicas differ");
  CHECK(strstr(pmap_last_error(), "devices 1 (") && strstr(pmap_last_error(), ", 3 ("),
        "names devices 1 and 3: %s", pmap_last_error());
  /* Device 0 is the reference: when it alone differs, every other device is named. */
  flip(s.params->rep[1].opt, 2 * P - 1);
  flip(s.params->rep[3].opt, 0);
  flip(s.params->rep[0].w, 0);
  CHECK_FAILS(pmap_params_verify(s.params), PMAP_ERR_DEVICE, "3 of 4 replicas differ");
  flip(s.params->rep[0].w, 0);
  CHECK_OK(pmap_params_verify(s.params));
  state_close(&s);
}

static void poked_sharded(void) {
  state s;
  sharded(1);
  if (state_open(&s, "mlp", 4, NULL, 2, 64, 256)) return;
  CHECK(s.params->shard, "PMAP_SHARD_OPTIMIZER=1 shards the optimizer");
  state_train(&s, 0, 3, NULL);
  size_t P = pmap_params_count(s.params);
  flip(s.params->rep[2].w, P - 1);
  CHECK_FAILS(pmap_params_verify(s.params), PMAP_ERR_DEVICE, "1 of 4 replicas differ");
  flip(s.params->rep[2].w, P - 1);
  CHECK_OK(pmap_params_verify(s.params));
  /* Each device's part of the state is its own: nothing to compare it with. */
  flip(s.params->rep[1].opt, 0);
  CHECK_OK(pmap_params_verify(s.params));
  flip(s.params->rep[1].opt, 0);
  state_close(&s);
}

static void identical(const char *name, const pmap_optimizer *opt, int n, int64_t batch,
                      int64_t rows) {
  state s;
  if (state_open(&s, name, n, opt, 2, batch, rows)) return;
  CHECK_OK(pmap_params_verify(s.params));
  state_train(&s, 0, 5, NULL);
  CHECK_OK(pmap_params_verify(s.params));
  state_close(&s);
}

static void drift(int shard) {
  /* The fault is read when the context is created. */
  setenv("PMAP_FAULT", "drift:device=1:step=3", 1);
  sharded(shard);
  state s;
  int bad = state_open(&s, "mlp", 3, NULL, 2, 96, 288);
  unsetenv("PMAP_FAULT");
  if (bad) return;
  state_train(&s, 0, 2, NULL);
  CHECK_OK(pmap_params_verify(s.params));
  state_train(&s, 2, 3, NULL); /* step 3 drifts after its optimizer step */
  CHECK_FAILS(pmap_params_verify(s.params), PMAP_ERR_DEVICE, "device 1 (");
  CHECK(strstr(pmap_last_error(), "device 2 (") == NULL && strstr(pmap_last_error(), "1 of 3"),
        "only device 1 drifted: %s", pmap_last_error());
  state_train(&s, 3, 4, NULL);
  /* Replicated, the drift stays; sharded, the parameter drifted (global index 0, device 0's
   * part) comes back from device 0 in the next all-gather. */
  if (shard)
    CHECK_OK(pmap_params_verify(s.params));
  else
    CHECK_FAILS(pmap_params_verify(s.params), PMAP_ERR_DEVICE, "device 1 (");
  state_close(&s);
}

int main(void) {
  CHECK_FAILS(pmap_params_verify(NULL), PMAP_ERR_INVALID_ARGUMENT, "params is NULL");
  pmap_optimizer sgd = pmap_sgd(0.01f, 0.0f), sgdm = pmap_sgd(0.01f, 0.9f);
  for (int shard = 0; shard <= 1; shard++) {
    sharded(shard);
    for (int n = 1; n <= 4; n++) {
      identical("mlp", NULL, n, 64 * n, 512);
      identical("mlp", &sgd, n, 64 * n, 512);
      identical("convnet", &sgdm, n, 4 * n, 64);
    }
  }
  poked();
  poked_sharded();
  drift(0);
  drift(1);
  return test_exit("verify");
}
