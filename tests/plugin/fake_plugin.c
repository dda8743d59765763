/* fake_plugin.c: a libpmap-cuda.so from "another build" for tests/plugin/test_plugin.sh: its
 * entry points answer with an interface number that is not libpmap's and touch nothing, as a
 * real plugin of another build does. */
#include <stdint.h>

#define FOREIGN_ABI UINT64_C(0x0123456789abcdef)

__attribute__((visibility("default"))) uint64_t pmap_cuda_backend_entry(uint64_t abi,
                                                                        const void *core,
                                                                        void *out);
__attribute__((visibility("default"))) uint64_t pmap_cuda_ops_entry(uint64_t abi, const void *base,
                                                                    void *out);

uint64_t pmap_cuda_backend_entry(uint64_t abi, const void *core, void *out) {
  (void)abi, (void)core, (void)out;
  return FOREIGN_ABI;
}

uint64_t pmap_cuda_ops_entry(uint64_t abi, const void *base, void *out) {
  (void)abi, (void)base, (void)out;
  return FOREIGN_ABI;
}
