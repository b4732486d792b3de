/* CRC-32C (Castagnoli) of image records: catches damaged bytes on disk. */
#ifndef GPUCR_CRC32C_H
#define GPUCR_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t crc32c(uint32_t crc, const void *buf, size_t len);

#endif
