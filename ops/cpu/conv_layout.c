/* conv_layout.c: activations between NCHW and the channel-blocked layouts of oneDNN's
 * convolution primitives (conv.h), with the ReLU on the way out and its gradient on the way in,
 * so that neither takes a pass of its own. A tile of TILE pixels by one block of channels goes
 * through a small array, so that both sides are read and written with unit stride. */
#include "conv.h"
#include "ops/op_math.h"

#define TILE 16

/* One block of channels (cl of them valid) of one example: src (hw, B) -> dst (cl, hw). */
CPU_INLINE void unblock_one(int B, const float *src, int64_t hw, int64_t cl, int relu, float *dst) {
  float t[16][TILE];
  for (int64_t p0 = 0; p0 < hw; p0 += TILE) {
    int64_t pl = hw - p0 < TILE ? hw - p0 : TILE;
    for (int64_t p = 0; p < pl; p++)
      for (int k = 0; k < B; k++) t[k][p] = src[(p0 + p) * B + k];
    for (int64_t k = 0; k < cl; k++) {
      float *row = dst + k * hw + p0;
      if (relu)
        for (int64_t p = 0; p < pl; p++) row[p] = pmap_relu(t[k][p]);
      else
        for (int64_t p = 0; p < pl; p++) row[p] = t[k][p];
    }
  }
}

/* One block of channels of one example: dst (hw, B) = the gradient of (cl, hw), then zeros. */
CPU_INLINE void block_one(int B, const float *y, const float *dy, int64_t hw, int64_t cl,
                          float *dst) {
  float t[16][TILE];
  for (int64_t p0 = 0; p0 < hw; p0 += TILE) {
    int64_t pl = hw - p0 < TILE ? hw - p0 : TILE;
    for (int64_t k = 0; k < cl; k++) {
      const float *dr = dy + k * hw + p0;
      if (y) {
        const float *yr = y + k * hw + p0;
        for (int64_t p = 0; p < pl; p++) t[k][p] = pmap_relu_grad(yr[p], dr[p]);
      } else {
        for (int64_t p = 0; p < pl; p++) t[k][p] = dr[p];
      }
    }
    for (int64_t k = cl; k < B; k++)
      for (int64_t p = 0; p < pl; p++) t[k][p] = 0.0f;
    for (int64_t p = 0; p < pl; p++)
      for (int k = 0; k < B; k++) dst[(p0 + p) * B + k] = t[k][p];
  }
}

/* Every example and block of channels, at a block size the compiler knows (B is a constant
 * after inlining). */
CPU_INLINE void unblock_all(int B, const conv_layout *l, const float *yb, int relu, float *y) {
  int64_t cblocks = (l->c + B - 1) / B;
  for (int64_t i = 0; i < l->n; i++)
    for (int64_t cb = 0; cb < cblocks; cb++) {
      int64_t cl = l->c - cb * B < B ? l->c - cb * B : B;
      unblock_one(B, yb + (i * cblocks + cb) * l->hw * B, l->hw, cl, relu,
                  y + (i * l->c + cb * B) * l->hw);
    }
}

CPU_INLINE void block_all(int B, const conv_layout *l, const float *y, const float *dy, float *gb) {
  int64_t cblocks = (l->c + B - 1) / B;
  for (int64_t i = 0; i < l->n; i++)
    for (int64_t cb = 0; cb < cblocks; cb++) {
      int64_t cl = l->c - cb * B < B ? l->c - cb * B : B, at = (i * l->c + cb * B) * l->hw;
      block_one(B, y ? y + at : NULL, dy + at, l->hw, cl, gb + (i * cblocks + cb) * l->hw * B);
    }
}

CPU_KERNEL_VOID(extern, conv_unblock, (const conv_layout *l, const float *yb, int relu, float *y),
                (l, yb, relu, y)) {
  size_t n = (size_t)(l->n * l->c * l->hw);
  switch (l->block) {
  case 16: unblock_all(16, l, yb, relu, y); break;
  case 8: unblock_all(8, l, yb, relu, y); break;
  case 4: unblock_all(4, l, yb, relu, y); break;
  default:
    if (relu) {
      CPU_IVDEP for (size_t k = 0; k < n; k++) y[k] = pmap_relu(yb[k]);
    } else if (y != yb) {
      CPU_IVDEP for (size_t k = 0; k < n; k++) y[k] = yb[k];
    }
  }
}

CPU_KERNEL_VOID(extern, conv_block_grad,
                (const conv_layout *l, const float *y, const float *dy, float *gb),
                (l, y, dy, gb)) {
  size_t n = (size_t)(l->n * l->c * l->hw);
  switch (l->block) {
  case 16: block_all(16, l, y, dy, gb); break;
  case 8: block_all(8, l, y, dy, gb); break;
  case 4: block_all(4, l, y, dy, gb); break;
  default:
    if (y) {
      CPU_IVDEP for (size_t k = 0; k < n; k++) gb[k] = pmap_relu_grad(y[k], dy[k]);
    } else if (gb != dy) {
      CPU_IVDEP for (size_t k = 0; k < n; k++) gb[k] = dy[k];
    }
  }
}
