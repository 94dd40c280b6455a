// The plain forward's logits at every position of one sequence: the
// reference the KV-cache paths (contiguous and paged) are checked against.
#pragma once
#include <vector>

#include "model/transformer.h"
#include "ops/ops.h"

namespace nk::test {

// Logits f32 [T * V] of forward_all_logits over `toks` (batch 1).
inline std::vector<float> full_logits(Transformer& m, const std::vector<int32_t>& toks) {
  const int64_t T = int64_t(toks.size()), V = m.config().vocab_size;
  Activations a(m.config(), m.compute_dtype(), 1, T, false);
  Tensor t = Tensor::empty({1, T}, DType::I32), lg = Tensor::empty({T, V}, DType::F32);
  ops::copy_bytes_from_host(t, toks.data());
  m.forward_all_logits(a, t, lg);
  std::vector<float> out(size_t(T * V));
  ops::copy_to_host(lg, out.data());
  return out;
}

}  // namespace nk::test
