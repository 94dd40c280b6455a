// A micro-batch as one context-parallel rank holds it (nn/context_parallel.h):
// of each row of T tokens cut into 2·cp chunks, chunk r and chunk 2·cp−1−r
// for cp rank r, and their global positions (for the rotary or learned
// position embeddings). The loss's targets are cut the same way, so each
// rank's tokens keep their own next-token targets.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace nk::parallel {

// local i32 [B, T/cp] <- rank r's chunks of full i32 [B, T] (host tensors).
// nk::Error when T is not a multiple of 2·cp.
void cp_local_rows(const Tensor& full, Tensor local, int64_t rank, int64_t cp);
// positions i32 [B, T/cp]: the global position of each of rank r's tokens.
void cp_local_positions(Tensor positions, int64_t rank, int64_t cp);

}  // namespace nk::parallel
