/* finalize_stop.c: preloaded (LD_PRELOAD) into the processes of an mpi test, it stops the
 * process whose rank PMAP_TEST_FINALIZE_STOP names (SIGSTOP) as it enters MPI_Finalize, after
 * its last step, its last save and every agreement before MPI_Finalize; the others then wait in
 * MPI_Finalize for a process that never comes. Every other process finalises as usual. */
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

int MPI_Finalize(void);

int MPI_Finalize(void) {
  const char *rank = getenv("OMPI_COMM_WORLD_RANK");
  const char *stop = getenv("PMAP_TEST_FINALIZE_STOP");
  if (rank && stop && !strcmp(rank, stop)) raise(SIGSTOP);
  int (*real)(void) = NULL;
  void *sym = dlsym(RTLD_DEFAULT, "PMPI_Finalize");
  memcpy(&real, &sym, sizeof real);
  return real ? real() : 0;
}
