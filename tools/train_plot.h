/* train_plot.h: pmap-train's loss curve, drawn by gnuplot ($PMAP_GNUPLOT, else gnuplot on the
 * PATH). */
#ifndef PMAP_TOOLS_TRAIN_PLOT_H
#define PMAP_TOOLS_TRAIN_PLOT_H

#include <stddef.h>
#include <stdint.h>

/* Draws loss (n) against step (n) into the PNG `file` titled `title`. Every failure is a note on
 * stderr prefixed with prog, never a failed run. */
void train_plot_loss(const char *prog, const char *file, const char *title, const int64_t *step,
                     const float *loss, size_t n);

#endif
