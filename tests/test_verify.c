/* test_verify.c: pmap_params_verify passes on identical replicas (1..4 devices, with and without
 * optimizer state, before and after training and a load) and names the drifted device when the
 * fault injection PMAP_FAULT=drift:device=1:step=2 perturbs device 1's replica after step 2, or
 * when the test itself flips one bit of a replica's parameters or optimizer state (white box:
 * CPU device memory is host memory, reached through the inside of pmap_params). */
#include "ckpt_util.h"
#include "models/params.h"

/* Flips the lowest mantissa bit of x[i] (CPU device memory). */
static void flip(float *x, size_t i) {
  uint32_t v;
  memcpy(&v, &x[i], 4);
  v ^= 1u;
  memcpy(&x[i], &v, 4);
}

static void poked(void) {
  state s;
  if (state_open(&s, "mlp", 4, NULL, 2, 64, 256)) return;
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

static void identical(const char *name, const pmap_optimizer *opt, int n, int64_t batch,
                      int64_t rows) {
  state s;
  if (state_open(&s, name, n, opt, 2, batch, rows)) return;
  CHECK_OK(pmap_params_verify(s.params));
  state_train(&s, 0, 5, NULL);
  CHECK_OK(pmap_params_verify(s.params));
  state_close(&s);
}

static void drift(void) {
  /* The fault is read when the context is created. */
  setenv("PMAP_FAULT", "drift:device=1:step=2", 1);
  state s;
  int bad = state_open(&s, "mlp", 3, NULL, 2, 96, 288);
  unsetenv("PMAP_FAULT");
  if (bad) return;
  state_train(&s, 0, 2, NULL);
  CHECK_OK(pmap_params_verify(s.params));
  state_train(&s, 2, 4, NULL);
  CHECK_FAILS(pmap_params_verify(s.params), PMAP_ERR_DEVICE, "device 1 (");
  CHECK(strstr(pmap_last_error(), "device 2 (") == NULL && strstr(pmap_last_error(), "1 of 3"),
        "only device 1 drifted: %s", pmap_last_error());
  state_close(&s);
}

int main(void) {
  CHECK_FAILS(pmap_params_verify(NULL), PMAP_ERR_INVALID_ARGUMENT, "params is NULL");
  pmap_optimizer sgd = pmap_sgd(0.01f, 0.0f), sgdm = pmap_sgd(0.01f, 0.9f);
  for (int n = 1; n <= 4; n++) {
    identical("mlp", NULL, n, 64 * n, 512);
    identical("mlp", &sgd, n, 64 * n, 512);
    identical("convnet", &sgdm, n, 4 * n, 64);
  }
  poked();
  drift();
  return test_exit("verify");
}
