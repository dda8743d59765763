/* crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of checkpoint
 * sections and of pmap_params_verify. Incremental: feed crc32c_update the previous value. */
#ifndef PMAP_MODELS_CRC32C_H
#define PMAP_MODELS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of data (bytes) continuing from crc (0 for the first piece): crc32c_update(0, "123456789",
 * 9) == 0xE3069283. */
uint32_t crc32c_update(uint32_t crc, const void *data, size_t bytes);

#endif
