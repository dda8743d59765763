/* dist_env.h: the choice between one process and many (runtime/dist/dist_env.c, compiled into
 * libpmap for dist.c and into the MPI plugin for its transport). */
#ifndef PMAP_RUNTIME_DIST_ENV_H
#define PMAP_RUNTIME_DIST_ENV_H

#include "pmap.h"

/* The process count an MPI launcher announced in the environment (0 when none), and the name
 * of the variable that said so (*var, may be NULL). */
long dist_env_launch_size(const char **var);
/* cfg->dist, with PMAP_DIST_AUTO resolved by PMAP_DIST where that is set to none or mpi (auto
 * stays auto: the transport then looks at the launch). */
pmap_status dist_env_mode(const pmap_config *cfg, pmap_dist_mode *out);

#endif
