// A weight stored as runs of rows of different block types (ops/quant.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace nk::ops {

void quant_linear_forward_runs(Tensor y, const Tensor& x, const std::vector<QuantWeight>& runs,
                               const Tensor& b) {
  NK_CHECK(!runs.empty(), "quant_linear_forward_runs: no runs");
  if (runs.size() == 1) return quant_linear_forward(y, x, runs[0], b);
  NK_CHECK(y.ndim() == 2 && y.is_contiguous() && y.on_host(),
           "quant_linear_forward_runs: y {} is not a contiguous host matrix", y.desc());
  const int64_t N = y.dim(0), out = y.dim(1);
  const size_t es = dtype_size(y.dtype());
  // Runs of a fused weight are few (q and k, then v): each is computed into a
  // scratch block and its columns copied into y. Grown, never shrunk: no
  // allocation after the first call of a size. Called from one thread.
  static thread_local std::vector<char> scratch;
  int64_t c0 = 0;
  for (const QuantWeight& q : runs) {
    const int64_t r = q.rows();
    NK_CHECK(c0 + r <= out, "quant_linear_forward_runs: runs of {} rows for y {}", c0 + r,
             y.desc());
    scratch.resize(std::max(scratch.size(), size_t(N * r) * es));
    Tensor part = Tensor::from_blob(scratch.data(), {N, r}, y.dtype());
    quant_linear_forward(part, x, q, b.defined() ? b.narrow0(c0, r) : b);
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(static_cast<char*>(y.raw()) + (n * out + c0) * es, scratch.data() + n * r * es,
                  size_t(r) * es);
    c0 += r;
  }
  NK_CHECK(c0 == out, "quant_linear_forward_runs: runs of {} rows for y {}", c0, y.desc());
}

std::vector<QuantWeight> quant_slice_rows(const std::vector<QuantWeight>& runs, int64_t row0,
                                          int64_t n) {
  std::vector<QuantWeight> out;
  int64_t start = 0, total = 0;
  for (const QuantWeight& q : runs) total += q.rows();
  NK_CHECK(row0 >= 0 && n > 0 && row0 + n <= total,
           "quant_slice_rows: rows [{}, {}) of a weight of {} rows", row0, row0 + n, total);
  for (const QuantWeight& q : runs) {
    const int64_t a = std::max(row0, start), b = std::min(row0 + n, start + q.rows());
    if (a < b) {
      const int64_t r0 = a - start, r = b - a;
      NK_CHECK(q.layout == QuantLayout::Rows || (r0 % 16 == 0 && r % 16 == 0),
               "quant_slice_rows: rows [{}, {}) of a weight packed in groups of 16 rows", a, b);
      QuantWeight s = q;
      s.shape = {r, q.cols()};
      const int64_t rb = int64_t(q.row_bytes());
      s.data = q.data.narrow0(r0 * rb, r * rb);
      if (q.scale.defined()) s.scale = q.scale.narrow0(r0, r);
      out.push_back(s);
    }
    start += q.rows();
  }
  return out;
}

}  // namespace nk::ops
