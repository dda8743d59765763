/* crc32c.c: software CRC-32C, slicing by 8 (about 1 GB/s a core, well above the disk writes and
 * device downloads it checks). The tables are built once, thread-safely, on first use. */
#include <pthread.h>

#include "crc32c.h"

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

uint32_t crc32c_update(uint32_t crc, const void *data, size_t bytes) {
  pthread_once(&table_once, build_table);
  const unsigned char *p = data;
  uint32_t c = ~crc;
  /* Byte order independent: the 8-byte step assembles its words from bytes. */
  while (bytes >= 8) {
    uint32_t lo =
        c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
    c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^
        table[4][lo >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
    p += 8;
    bytes -= 8;
  }
  while (bytes--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
  return ~c;
}
