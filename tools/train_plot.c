/* train_plot.c: pmap-train's --plot: the loss curve drawn into a PNG by gnuplot, as an extra
 * that never fails a run (train_plot.h). */
#include "train_plot.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The gnuplot to run: $PMAP_GNUPLOT, else "gnuplot"; a bare name is looked up on the PATH.
 * Writes the path into buf; 0 when there is none. */
static int find_gnuplot(char *buf, size_t size) {
  const char *name = getenv("PMAP_GNUPLOT");
  if (!name || !*name) name = "gnuplot";
  if (strchr(name, '/')) {
    snprintf(buf, size, "%s", name);
    return access(buf, X_OK) == 0;
  }
  const char *path = getenv("PATH");
  while (path && *path) {
    size_t len = strcspn(path, ":");
    if (len && (size_t)snprintf(buf, size, "%.*s/%s", (int)len, path, name) < size &&
        access(buf, X_OK) == 0)
      return 1;
    path += len + (path[len] == ':');
  }
  return 0;
}

/* Draws loss (n) against step into the PNG `file` through gnuplot. Plotting is an extra:
 * every failure is a note on stderr, never a failed run. */
void train_plot_loss(const char *prog, const char *file, const char *title, const int64_t *step,
                     const float *loss, size_t n) {
  char gp[4096];
  if (!find_gnuplot(gp, sizeof gp)) {
    fprintf(stderr,
            "%s: note: --plot: gnuplot not found (install it, e.g. apt-get install "
            "gnuplot-nox, or set PMAP_GNUPLOT); no loss curve drawn\n",
            prog);
    return;
  }
  if (strchr(gp, '\'') || strchr(file, '\'') || strchr(file, '\n')) {
    fprintf(stderr,
            "%s: note: --plot: quotes in the file or gnuplot path are not supported; "
            "no loss curve drawn\n",
            prog);
    return;
  }
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "'%s'", gp);
  remove(file);
  /* gnuplot exiting early must end the plot, not this process. */
  void (*old)(int) = signal(SIGPIPE, SIG_IGN);
  FILE *p = popen(cmd, "w");
  if (!p) {
    signal(SIGPIPE, old);
    fprintf(stderr, "%s: note: --plot: cannot run %s; no loss curve drawn\n", prog, gp);
    return;
  }
  int positive = 1;
  for (size_t i = 0; i < n; i++) positive &= loss[i] > 0.0f && isfinite(loss[i]);
  fprintf(p,
          "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 800,500 "
          "noenhanced } else { set terminal png size 800,500 noenhanced }\n"
          "set output '%s'\nset title '%s'\nset xlabel 'step'\nset ylabel 'loss'\n"
          "set grid\n%sset key off\nplot '-' using 1:2 with lines linewidth 2\n",
          file, title, positive ? "set logscale y\n" : "");
  for (size_t i = 0; i < n; i++) fprintf(p, "%lld %.9g\n", (long long)step[i], (double)loss[i]);
  fprintf(p, "e\n");
  int rc = pclose(p);
  signal(SIGPIPE, old);
  FILE *check = fopen(file, "rb");
  if (rc != 0 || !check)
    fprintf(stderr,
            "%s: note: --plot: gnuplot (%s) failed (exit status %d); no loss curve "
            "drawn\n",
            prog, gp, rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
  else
    printf("loss curve: %s\n", file);
  if (check) fclose(check);
}
