/* dist_none.c: the inter-process transport of a build without MPI: every context is one
 * process, and a request for more (or an MPI launch) is a clear error rather than P
 * independent trainings. */
#include "dist.h"
#include "dist_env.h"
#include "base/error.h"

pmap_status dist_open(const pmap_config *cfg, pmap_backend kind, int local_devices,
                      int64_t timeout_ns, pmap_dist **out, int *rank, int *size) {
  (void)kind;
  (void)local_devices;
  (void)timeout_ns;
  *out = NULL;
  *rank = 0;
  *size = 1;
  pmap_dist_mode mode;
  PMAP_TRY(dist_env_mode(cfg, &mode));
  const char *var = NULL;
  long launched = dist_env_launch_size(&var);
  if (mode == PMAP_DIST_MPI)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                    "pmap_ctx_create: dist is mpi but this build has no MPI (install "
                    "libopenmpi-dev and configure with -Dmpi=enabled)");
  if (mode == PMAP_DIST_AUTO && launched > 1)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                    "pmap_ctx_create: started by an MPI launcher with %ld processes (%s) but "
                    "this build has no MPI, so each process would train alone; configure with "
                    "-Dmpi=enabled, or set PMAP_DIST=none to run the processes independently",
                    launched, var);
  return PMAP_SUCCESS;
}

void dist_close(pmap_dist *d) { (void)d; }

static pmap_status no_dist(void) {
  return PMAP_ERR(PMAP_ERR_INTERNAL, "inter-process exchange in a build without MPI");
}

pmap_status dist_agree(pmap_dist *d, const dist_call *c, const char *who) {
  (void)d, (void)c, (void)who;
  return no_dist();
}
pmap_status dist_end_job(pmap_dist *d, dist_outcome *io, const char *who) {
  (void)d, (void)io, (void)who;
  return no_dist();
}
pmap_status dist_all_reduce(pmap_dist *d, float *buf, size_t count, int max) {
  (void)d, (void)buf, (void)count, (void)max;
  return no_dist();
}
pmap_status dist_broadcast(pmap_dist *d, void *buf, size_t bytes, int root) {
  (void)d, (void)buf, (void)bytes, (void)root;
  return no_dist();
}
pmap_status dist_all_gather(pmap_dist *d, const void *send, size_t bytes, const void **out) {
  (void)d, (void)send, (void)bytes;
  *out = NULL;
  return no_dist();
}
pmap_status dist_exchange(pmap_dist *d, const char *call, const void *mine, size_t bytes,
                          const void **all) {
  (void)d, (void)call, (void)mine, (void)bytes;
  *all = NULL;
  return no_dist();
}
pmap_status dist_broadcast_bytes(pmap_dist *d, void *buf, size_t bytes, int root) {
  (void)d, (void)buf, (void)bytes, (void)root;
  return no_dist();
}
void dist_abandon(pmap_dist *d, pmap_status s, const char *msg) { (void)d, (void)s, (void)msg; }
int dist_rank(const pmap_dist *d) {
  (void)d;
  return 0;
}
int dist_size(const pmap_dist *d) {
  (void)d;
  return 1;
}
const char *dist_host(const pmap_dist *d, int r) {
  (void)d, (void)r;
  return "?";
}
uint64_t dist_seq(const pmap_dist *d) {
  (void)d;
  return 0;
}
uint64_t dist_alone_seq(const pmap_dist *d) {
  (void)d;
  return 0;
}
int dist_broken(const pmap_dist *d) {
  (void)d;
  return 0;
}
