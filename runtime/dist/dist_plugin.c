/* dist_plugin.c: the MPI plugin's door (libpmap-mpi.so, base/plugin.h): its entry point, which
 * gives the runtime the MPI transport (dist_mpi.c, dist_mpi_open.c implement dist.h inside the
 * plugin), and the core functions the transport calls, under their own names, forwarded to the
 * core's through the table the entry receives. */
#include <stdatomic.h>

#include "dist.h"
#include "runtime/sync.h"

static const pmap_dist_i transport = {
    dist_open,      dist_close,      dist_agree,    dist_end_job,         dist_all_reduce,
    dist_broadcast, dist_all_gather, dist_exchange, dist_broadcast_bytes, dist_rank,
    dist_size,      dist_host,       dist_seq,      dist_alone_seq,       dist_abandon,
    dist_broken,
};

/* Set by the entry point, before any other code of the plugin runs. */
static const dist_core_i *_Atomic core;

PMAP_PLUGIN_EXPORT uint64_t pmap_mpi_dist_entry(uint64_t abi, const dist_core_i *c,
                                                const pmap_dist_i **out);

uint64_t pmap_mpi_dist_entry(uint64_t abi, const dist_core_i *c, const pmap_dist_i **out) {
  uint64_t mine = dist_plugin_abi();
  if (abi != mine) return mine; /* another build: touch nothing of it */
  pmap_plugin_bind_base(c->base);
  atomic_store(&core, c);
  *out = &transport;
  return mine;
}

int64_t pmap_now_ns(void) { return atomic_load(&core)->now_ns(); }
const char *pmap_backend_name(pmap_backend b) { return atomic_load(&core)->backend_name(b); }
