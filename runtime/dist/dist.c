/* dist.c: the inter-process transport as the runtime calls it (dist.h). A context of one process
 * has none (d is NULL); one across processes has the MPI transport of the MPI plugin
 * (libpmap-mpi.so), opened the first time a context needs it, so libpmap.so itself needs no
 * MPI. In a build without MPI a request for more than one process (or an MPI launch) is a clear
 * error rather than P independent trainings. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "dist.h"
#include "dist_env.h"
#include "runtime/sync.h"

/* The MPI plugin's transport once opened; every d that is not NULL is one of its. */
static const pmap_dist_i *_Atomic mpi;

#if defined(PMAP_HAVE_MPI)
static const dist_core_i plugin_core = {&pmap_base_table, pmap_now_ns, pmap_backend_name};

/* The MPI plugin's transport, opening the plugin the first time (what names the context that
 * needs it, for the message). RTLD_GLOBAL: Open MPI's components, which libmpi opens, need
 * libmpi's symbols in the global scope. */
static pmap_status open_mpi(const char *what, const pmap_dist_i **out) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&lock);
  pmap_status st = PMAP_SUCCESS;
  if (!atomic_load(&mpi)) {
    void *sym = NULL;
    st = pmap_plugin_symbol(PMAP_PLUGIN_MPI, "pmap_mpi_dist_entry", 1, what, &sym);
    if (!st) {
      dist_plugin_entry entry;
      memcpy(&entry, &sym, sizeof entry); /* dlsym's data pointer to a function's */
      const pmap_dist_i *t = NULL;
      uint64_t theirs = entry(dist_plugin_abi(), &plugin_core, &t);
      st = pmap_plugin_abi_check(what, PMAP_PLUGIN_MPI, theirs, dist_plugin_abi());
      if (!st && !t)
        st = PMAP_ERR(PMAP_ERR_INTERNAL, "%s: the plugin %s gave no transport", what,
                      PMAP_PLUGIN_MPI);
      else if (!st)
        atomic_store(&mpi, t);
    }
  }
  pthread_mutex_unlock(&lock);
  *out = atomic_load(&mpi);
  return st;
}

/* Whether MPI may have been started in this process without a launcher's variables: the MPI
 * plugin is open, or the program has an MPI of its own in the global scope (linked with it, or
 * loaded as mpi4py does). Otherwise AUTO means one process without opening the plugin. */
static int mpi_in_process(void) {
  return atomic_load(&mpi) != NULL || dlsym(RTLD_DEFAULT, "MPI_Initialized") != NULL;
}
#endif

pmap_status dist_open(const pmap_config *cfg, pmap_backend kind, int local_devices,
                      int64_t timeout_ns, pmap_dist **out, int *rank, int *size) {
  *out = NULL;
  *rank = 0;
  *size = 1;
  pmap_dist_mode mode;
  PMAP_TRY(dist_env_mode(cfg, &mode));
  const char *var = NULL;
  long launched = dist_env_launch_size(&var);
#if defined(PMAP_HAVE_MPI)
  if (mode == PMAP_DIST_NONE || (mode == PMAP_DIST_AUTO && launched <= 1 && !mpi_in_process()))
    return PMAP_SUCCESS;
  char what[160];
  if (mode == PMAP_DIST_MPI)
    snprintf(what, sizeof what, "pmap_ctx_create: dist mpi");
  else if (launched <= 1)
    snprintf(what, sizeof what, "pmap_ctx_create: dist auto with MPI in the process");
  else
    snprintf(what, sizeof what,
             "pmap_ctx_create: a context across the %ld processes an MPI launcher started (%s; "
             "PMAP_DIST=none runs them independently)",
             launched, var);
  const pmap_dist_i *t = NULL;
  PMAP_TRY(open_mpi(what, &t));
  return t->open(cfg, kind, local_devices, timeout_ns, out, rank, size);
#else
  (void)kind;
  (void)local_devices;
  (void)timeout_ns;
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
#endif
}

pmap_status dist_close(pmap_dist *d) { return d ? atomic_load(&mpi)->close(d) : PMAP_SUCCESS; }

/* An exchange on a context of one process: a bug of the caller. */
static pmap_status no_dist(void) {
  return PMAP_ERR(PMAP_ERR_INTERNAL, "inter-process exchange in a context of one process");
}

pmap_status dist_agree(pmap_dist *d, const dist_call *c, const char *who) {
  return d ? atomic_load(&mpi)->agree(d, c, who) : no_dist();
}
pmap_status dist_end_job(pmap_dist *d, dist_outcome *io, const char *who) {
  return d ? atomic_load(&mpi)->end_job(d, io, who) : no_dist();
}
pmap_status dist_all_reduce(pmap_dist *d, float *buf, size_t count, int max) {
  return d ? atomic_load(&mpi)->all_reduce(d, buf, count, max) : no_dist();
}
pmap_status dist_broadcast(pmap_dist *d, void *buf, size_t bytes, int root) {
  return d ? atomic_load(&mpi)->broadcast(d, buf, bytes, root) : no_dist();
}
pmap_status dist_all_gather(pmap_dist *d, const void *send, size_t bytes, const void **out) {
  *out = NULL;
  return d ? atomic_load(&mpi)->all_gather(d, send, bytes, out) : no_dist();
}
pmap_status dist_exchange(pmap_dist *d, const char *call, const void *mine, size_t bytes,
                          const void **all) {
  *all = NULL;
  return d ? atomic_load(&mpi)->exchange(d, call, mine, bytes, all) : no_dist();
}
pmap_status dist_broadcast_bytes(pmap_dist *d, void *buf, size_t bytes, int root) {
  return d ? atomic_load(&mpi)->broadcast_bytes(d, buf, bytes, root) : no_dist();
}
void dist_abandon(pmap_dist *d, pmap_status s, const char *msg) {
  if (d) atomic_load(&mpi)->abandon(d, s, msg);
}
int dist_rank(const pmap_dist *d) { return d ? atomic_load(&mpi)->rank(d) : 0; }
int dist_size(const pmap_dist *d) { return d ? atomic_load(&mpi)->size(d) : 1; }
const char *dist_host(const pmap_dist *d, int r) { return d ? atomic_load(&mpi)->host(d, r) : "?"; }
uint64_t dist_seq(const pmap_dist *d) { return d ? atomic_load(&mpi)->seq(d) : 0; }
uint64_t dist_alone_seq(const pmap_dist *d) { return d ? atomic_load(&mpi)->alone_seq(d) : 0; }
int dist_broken(const pmap_dist *d) { return d ? atomic_load(&mpi)->broken(d) : 0; }
