// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
// TFRecord framing (TensorBoard event files) among others.
#pragma once
#include <cstddef>
#include <cstdint>

namespace nk {

// The CRC of `n` bytes, continuing from `crc` (0 for a fresh one).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace nk
