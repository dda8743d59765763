/* rng.h: the deterministic random numbers of parameter initialisation and example data
 * (splitmix64; normals by Box-Muller in double), identical on every machine. */
#ifndef PMAP_MODELS_RNG_H
#define PMAP_MODELS_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct pmap_rng {
  uint64_t state;
} pmap_rng;

static inline pmap_rng pmap_rng_seed(uint64_t seed) {
  pmap_rng r = {seed ^ 0x9e3779b97f4a7c15ull};
  return r;
}

static inline uint64_t pmap_rng_next(pmap_rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double pmap_rng_uniform(pmap_rng *r) {
  return (double)(pmap_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static inline double pmap_rng_normal(pmap_rng *r) {
  double u1 = pmap_rng_uniform(r), u2 = pmap_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
