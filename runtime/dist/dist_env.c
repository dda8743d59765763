/* dist_env.c: whether a context spans processes, from pmap_config.dist, the PMAP_DIST variable
 * and the launcher's environment; shared by the runtime (dist.c) and the MPI plugin. */
#include <stdlib.h>
#include <string.h>

#include "dist_env.h"
#include "base/env.h"
#include "base/error.h"

long dist_env_launch_size(const char **var) {
  static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *s = getenv(names[i]);
    if (!s || !*s) continue;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (*end || v < 1) continue;
    if (var) *var = names[i];
    return v;
  }
  return 0;
}

pmap_status dist_env_mode(const pmap_config *cfg, pmap_dist_mode *out) {
  *out = cfg->dist;
  if (cfg->dist == PMAP_DIST_NONE || cfg->dist == PMAP_DIST_MPI) return PMAP_SUCCESS;
  if (cfg->dist != PMAP_DIST_AUTO)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: dist %d is none of PMAP_DIST_AUTO (0), PMAP_DIST_NONE (1), "
                    "PMAP_DIST_MPI (2)",
                    (int)cfg->dist);
  static const char *const modes[] = {"auto", "none", "mpi", NULL};
  int m = 0;
  PMAP_TRY(pmap_env_choice("PMAP_DIST", modes, 0, &m));
  if (m) *out = m == 1 ? PMAP_DIST_NONE : PMAP_DIST_MPI;
  return PMAP_SUCCESS;
}
