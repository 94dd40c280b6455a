// The one set of upper bounds on sizes a user can give (model shapes,
// vocabularies, sequence lengths, batch sizes), checked wherever a config or a
// checkpoint is read and before anything is allocated, and size arithmetic
// that reports overflow as an error instead of wrapping (signed overflow is
// undefined behaviour).
//
// The bounds are generous: the largest published dense models (Llama 3.1 405B:
// 126 layers, d_model 16384, d_ff 53248, 128 heads, 131072 positions; Llama 4
// Scout: 10M positions) and 256k-entry vocabularies fit with room to spare.
// What they stop is a corrupt or hostile file making Nekton loop for ever or
// ask for petabytes.
#pragma once
#include <cstdint>
#include <string>

namespace nk {

namespace limits {
inline constexpr int64_t kVocab = int64_t(1) << 22;        // token ids per vocabulary (4M)
inline constexpr int64_t kSeqLen = int64_t(1) << 24;       // positions per sequence (16M)
inline constexpr int64_t kLayers = int64_t(1) << 12;       // transformer layers
inline constexpr int64_t kHeads = int64_t(1) << 12;        // attention (and key/value) heads
inline constexpr int64_t kLabels = int64_t(1) << 12;       // a classifier's outputs (num_labels)
inline constexpr int64_t kHidden = int64_t(1) << 17;       // d_model
inline constexpr int64_t kFfn = int64_t(1) << 20;          // MLP inner size
inline constexpr int64_t kBatch = int64_t(1) << 24;        // sequences per batch or step
inline constexpr int64_t kBatchTokens = int64_t(1) << 32;  // tokens per micro-batch
inline constexpr int64_t kSteps = int64_t(1) << 40;        // optimizer steps of a run
inline constexpr int64_t kTensorDims = 16;                 // dimensions of one tensor
inline constexpr int64_t kElements = int64_t(1) << 46;     // elements of one tensor or arena
}  // namespace limits

// nk::Error "WHERE: KEY = VALUE is beyond the limit of LIMIT WHAT" unless
// 0 <= value <= limit (a negative value reports as out of range too).
void check_limit(const std::string& where, const std::string& key, int64_t value, int64_t limit,
                 const char* what);

// a * b and a + b over int64, or nk::Error "WHAT: A x B overflows" (never
// wraps). For sizes: element counts, bytes, batch x sequence.
int64_t checked_mul(int64_t a, int64_t b, const char* what);
int64_t checked_add(int64_t a, int64_t b, const char* what);

}  // namespace nk
