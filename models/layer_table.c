/* layer_table.c: the table of every layer class, made from the layer files meson.build lists
 * (layer_files.h), for what must see every class (tests/test_blocks.c: codes and blocks). Its
 * own file: the layers call models/layer.c, so a table there would make the two a cycle. */
#include "layer.h"
/* PMAP_LAYER_FILES, LAYER_FILE(act) LAYER_FILE(attention) ...: meson.build writes it from its list
 * of layer files, so that every file it builds is a file of the table. */
#include "layer_files.h"

#define LAYER_FILE(file) extern const layer_class *const layer_file_##file[];
PMAP_LAYER_FILES
#undef LAYER_FILE
#define LAYER_FILE(file) layer_file_##file,
static const layer_class *const *const layer_files[] = {PMAP_LAYER_FILES};
#undef LAYER_FILE
#define N_LAYER_FILES (int)(sizeof layer_files / sizeof layer_files[0])

int layer_class_count(void) {
  int n = 0;
  for (int f = 0; f < N_LAYER_FILES; f++)
    for (int k = 0; layer_files[f][k]; k++) n++;
  return n;
}

const layer_class *layer_class_at(int i) {
  for (int f = 0; f < N_LAYER_FILES; f++)
    for (int k = 0; layer_files[f][k]; k++)
      if (i-- == 0) return layer_files[f][k];
  return NULL;
}
