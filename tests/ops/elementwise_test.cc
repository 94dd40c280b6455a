// Copies, conversions and elementwise ops on every backend vs the reference /
// exact expectations.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/parallel.h"
#include "core/rng.h"
#include "ops/op_harness.h"
#include "ops/ops.h"
#include "ops/ref/elementwise.h"
#ifdef NK_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, expect_close, ...
using Vec = std::vector<double>;

const int64_t kSizes[] = {1, 15, 33, 70001};

// Special values every conversion must round-trip or round like the scalar helpers.
Vec conversion_inputs(int64_t n) {
  Vec v = randn(n, 1, 100.0);
  const double special[] = {
      0.0,       -0.0, 1e-40, 65504, 1e30, -1e30, std::numeric_limits<double>::infinity(),
      1.00390625};  // tie case
  for (size_t i = 0; i < 8 && i < v.size(); ++i) v[i] = special[i];
  return v;
}

class Elementwise : public BackendTest {};
NK_INSTANTIATE_BACKENDS(Elementwise);

NK_COVERS(Elementwise, ConvertMatchesScalarRounding, convert);
TEST_P(Elementwise, ConvertMatchesScalarRounding) {
  for (int64_t n : kSizes) {
    Vec x = rounded(conversion_inputs(n), DType::F32);
    Tensor src = make({n}, DType::F32, x, dev());
    Tensor b = Tensor::empty({n}, DType::BF16, dev()), h = Tensor::empty({n}, DType::F16, dev());
    ops::convert(b, src);
    ops::convert(h, src);
    const Tensor hb = to_host(b), hh = to_host(h);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(hb.data<bf16>()[i].bits, f32_to_bf16(float(x[i])).bits) << i;
      ASSERT_EQ(hh.data<f16>()[i].bits, f32_to_f16(float(x[i])).bits) << i;
    }
    Tensor back = Tensor::empty({n}, DType::F32, dev());
    ops::convert(back, b);  // widening is exact
    EXPECT_EQ(values(back), values(b)) << "bf16->f32";
  }
}

TEST_P(Elementwise, ConvertKeepsNaN) {
  Tensor src = make({1}, DType::F32, {std::nan("")}, dev()),
         dst = Tensor::empty({1}, DType::BF16, dev());
  ops::convert(dst, src);
  EXPECT_TRUE(std::isnan(bf16_to_f32(to_host(dst).data<bf16>()[0])));
}

NK_COVERS(Elementwise, FillAndHostCopies, fill, copy_from_host, copy_to_host);
TEST_P(Elementwise, FillAndHostCopies) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const int64_t n = 1001;
    Tensor t = Tensor::empty({n}, dt, dev());
    ops::fill(t, 0.3f);
    expect_close(values(t), rounded(Vec(n, 0.3f), dt), {0, 0}, "fill");
    std::vector<float> host(n);
    for (int64_t i = 0; i < n; ++i) host[i] = float(i) * 0.25f;
    ops::copy_from_host(t, host.data());
    std::vector<float> back(n);
    ops::copy_to_host(t, back.data());
    Vec want(host.begin(), host.end());
    expect_close(Vec(back.begin(), back.end()), rounded(want, dt), {0, 0}, "host copy");
  }
}

NK_COVERS(Elementwise, AddAccumulateScaleMatchReference, add, accumulate, scale);
TEST_P(Elementwise, AddAccumulateScaleMatchReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " n=" << n);
      Vec a = rounded(randn(n, 2), dt), b = rounded(randn(n, 3), dt);
      Tensor ta = make({n}, dt, a, dev()), tb = make({n}, dt, b, dev());
      ops::add(ta, ta, tb);  // y aliases a
      Vec y(n);
      ref::add(y.data(), a.data(), b.data(), n);
      expect_close(values(ta), y, tol_for(dt), "add");

      // Gradient accumulation: a dtype-dt gradient into a nonzero f32 buffer.
      Vec acc = rounded(randn(n, 4), DType::F32);
      Tensor tacc = make({n}, DType::F32, acc, dev());
      ops::accumulate(tacc, tb);
      ref::accumulate(acc.data(), b.data(), n);
      expect_close(values(tacc), acc, tol_for(DType::F32), "accumulate");

      ops::scale(tb, 0.37f);
      ref::scale(b.data(), 0.37, n);
      expect_close(values(tb), b, tol_for(dt), "scale");
    }
  }
}

// LoRA's column blocks: a part's output added into, and its gradient taken
// out of, the columns of a fused output.
NK_COVERS(Elementwise, ColumnBlocksMatchReference, add_columns, copy_columns);
TEST_P(Elementwise, ColumnBlocksMatchReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t N = 37, M = 24, m = 7, col0 = 9;
    Vec y = rounded(randn(N * M, 11), dt), z = rounded(randn(N * m, 12), dt);
    Tensor ty = make({N, M}, dt, y, dev()), tz = make({N, m}, dt, z, dev());
    ops::add_columns(ty, tz, col0, 0.5f);
    ref::add_columns(y.data(), z.data(), N, M, m, col0, 0.5);
    expect_close(values(ty), y, tol_for(dt), "add_columns");
    ops::copy_columns(tz, ty, col0, -2.f);
    ref::copy_columns(z.data(), y.data(), N, M, m, col0, -2.0);
    expect_close(values(tz), z, tol_for(dt), "copy_columns");
  }
  Tensor y = Tensor::empty({4, 8}, DType::F32, dev()), z = Tensor::empty({4, 3}, DType::F32, dev());
  EXPECT_THROW(ops::add_columns(y, z, 6, 1.f), InternalError);  // columns [6, 9) of 8
  EXPECT_THROW(ops::copy_columns(z, y, -1, 1.f), InternalError);
}

// IA3's column scaling and its gradient's column sums.
NK_COVERS(Elementwise, ColumnScalingMatchesReference, scale_columns, column_dot);
TEST_P(Elementwise, ColumnScalingMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t N = 301, M = 24, m = 7, col0 = 9;
    Vec y = rounded(randn(N * M, 21), dt), l = rounded(randn(m, 22), dt),
        b = rounded(randn(N * m, 23), dt), dl = rounded(randn(m, 24), DType::F32);
    Tensor ty = make({N, M}, dt, y, dev()), tl = make({m}, dt, l, dev()),
           tb = make({N, m}, dt, b, dev()), tdl = make({m}, DType::F32, dl, dev());
    ops::column_dot(tdl, ty, col0, tb);
    ref::column_dot(dl.data(), y.data(), b.data(), N, M, m, col0);
    expect_close(values(tdl), dl, {1e-5, 1e-5}, "column_dot");
    ops::scale_columns(ty, tl, col0);
    ref::scale_columns(y.data(), l.data(), N, M, m, col0);
    expect_close(values(ty), y, tol_for(dt), "scale_columns");
  }
}

// A weight per row (per-token gradient weights on the logit gradients).
NK_COVERS(Elementwise, RowScalingMatchesReference, scale_rows);
TEST_P(Elementwise, RowScalingMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t N = 37, M = 301;
    Vec y = rounded(randn(N * M, 31), dt), s = randn(N, 32);
    Tensor ty = make({N, M}, dt, y, dev()), ts = make({N}, DType::F32, s, dev());
    ops::scale_rows(ty, ts);
    ref::scale_rows(y.data(), s.data(), N, M);
    expect_close(values(ty), y, tol_for(dt), "scale_rows");
  }
  Tensor y = Tensor::empty({4, 8}, DType::F32, dev()), s = Tensor::empty({3}, DType::F32, dev());
  EXPECT_THROW(ops::scale_rows(y, s), InternalError);  // 3 weights for 4 rows
}

// The mask is the reference's, drops about p of the elements, and is the same
// on a second call with the seed (how the backward re-applies it); another
// seed draws another mask.
NK_COVERS(Elementwise, DropoutMaskIsSeededAndMatchesReference, dropout);
TEST_P(Elementwise, DropoutMaskIsSeededAndMatchesReference) {
  const int64_t n = 100003;
  const float p = 0.25f;
  Vec x = rounded(randn(n, 13), DType::F32);
  Tensor tx = make({n}, DType::F32, x, dev()), ty = Tensor::empty({n}, DType::F32, dev());
  ops::dropout(ty, tx, p, 77);
  Vec want(n);
  ref::dropout(want.data(), x.data(), n, p, 77);
  expect_close(values(ty), want, tol_for(DType::F32), "dropout");
  int64_t dropped = 0;
  for (double v : values(ty)) dropped += v == 0.0;
  EXPECT_NEAR(double(dropped) / double(n), p, 0.01);
  Tensor again = Tensor::empty({n}, DType::F32, dev()), other = again;
  ops::dropout(again, tx, p, 77);
  EXPECT_EQ(values(again), values(ty));
  other = Tensor::empty({n}, DType::F32, dev());
  ops::dropout(other, tx, p, 78);
  EXPECT_NE(values(other), values(ty));
  ops::dropout(tx, tx, 0.f, 5);  // p = 0 keeps everything, in place
  EXPECT_EQ(values(tx), x);
  EXPECT_THROW(ops::dropout(ty, tx, 1.f, 1), InternalError);
}

NK_COVERS(Elementwise, SumSquaresMatchesReferenceAndIsThreadCountInvariant, sum_squares);
TEST_P(Elementwise, SumSquaresMatchesReferenceAndIsThreadCountInvariant) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t n : {int64_t(1), int64_t(33), int64_t(200001)}) {
      Vec x = rounded(randn(n, 5), dt);
      Tensor t = make({n}, dt, x, dev());
      const int saved = num_threads();
      set_num_threads(1);
      double one = ops::sum_squares(t);
      set_num_threads(3);
      double three = ops::sum_squares(t);
      set_num_threads(saved);
      EXPECT_EQ(one, three) << n;
      // Double accumulation of exact squares: only reordering error.
      EXPECT_NEAR(one, ref::sum_squares(x.data(), n), 1e-12 * double(n)) << n;
    }
  }
}

// NaN and both infinities count, in every float dtype, wherever they sit in a
// tensor that the threads split; the largest finite values do not.
NK_COVERS(Elementwise, CountNonfiniteMatchesReference, count_nonfinite);
TEST_P(Elementwise, CountNonfiniteMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (int64_t n : {int64_t(1), int64_t(33), int64_t(200001)}) {
      Vec x = rounded(randn(n, 7), dt);
      EXPECT_EQ(ops::count_nonfinite(make({n}, dt, x, dev())), 0) << n;
      const double big = dt == DType::F16 ? 65504.0 : dt == DType::BF16 ? 3.3e38 : 3.4e38;
      x[0] = big;
      x[n - 1] = -big;
      const double bad[] = {NAN, INFINITY, -INFINITY};
      for (int64_t i = 0; i < n; i += 997) x[size_t(i)] = bad[(i / 997) % 3];
      Tensor t = make({n}, dt, x, dev());
      const int64_t want = ref::count_nonfinite(x.data(), n);
      EXPECT_GT(want, 0);
      EXPECT_EQ(ops::count_nonfinite(t), want) << dtype_name(dt) << " " << n;
    }
  }
}

// Raw byte copies both ways keep every bit, whatever the dtype.
NK_COVERS(Elementwise, ByteCopiesRoundTrip, copy_bytes_from_host, copy_bytes_to_host);
TEST_P(Elementwise, ByteCopiesRoundTrip) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32}) {
    const Tensor src = make({3, 5}, dt, randn(15, 6, 100.0));
    Tensor t = Tensor::empty({3, 5}, dt, dev());
    ops::copy_bytes_from_host(t, src.raw());
    std::vector<char> back(src.nbytes());
    ops::copy_bytes_to_host(t, back.data());
    EXPECT_EQ(std::memcmp(back.data(), src.raw(), src.nbytes()), 0) << dtype_name(dt);
  }
}

// Token ids against a value (the ignore index, a real id, one that no
// int32 equals), over sizes that split into several blocks and threads;
// exact against a plain host count.
NK_COVERS(Elementwise, CountNotEqualMatchesHostCount, count_not_equal);
TEST_P(Elementwise, CountNotEqualMatchesHostCount) {
  for (int64_t n : {int64_t(1), int64_t(33), int64_t(70001), int64_t(3000001)}) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    Rng r(static_cast<uint64_t>(n));
    for (auto& id : ids) id = r.below(4) == 0 ? -100 : int32_t(r.below(50));
    const Tensor t = make_i32({n}, ids, dev());
    for (int64_t value : {int64_t(-100), int64_t(7), int64_t(1) << 40}) {
      int64_t want = 0;
      for (int32_t id : ids) want += id != value;
      EXPECT_EQ(ops::count_not_equal(t, value), want) << "n=" << n << " value=" << value;
    }
  }
  const Tensor targets = make_i32({2, 3}, {5, -100, 5, 5, 0, -100}, dev());  // [B, T]
  EXPECT_EQ(ops::count_not_equal(targets, 5), 3);
}

// Work queued on the device is done when synchronize returns: on CUDA the
// compute stream has nothing left to run (the ops return before their
// kernels finish), and the results are the host's f32 products exactly.
NK_COVERS(Elementwise, SynchronizeWaitsForQueuedWork, synchronize);
TEST_P(Elementwise, SynchronizeWaitsForQueuedWork) {
  const int64_t n = int64_t(1) << 22;
  const Vec x = rounded(randn(n, 31), DType::F32);
  Tensor t = make({n}, DType::F32, x, dev());
  for (int k = 0; k < 8; ++k) ops::scale(t, 1.5f);
  ops::synchronize(dev());
#ifdef NK_WITH_CUDA
  if (dev() == Device::CUDA) {
    EXPECT_EQ(cudaStreamQuery(::nk::cuda::stream()), cudaSuccess);
  }
#endif
  Vec want(x);
  for (double& w : want) {
    float v = float(w);
    for (int k = 0; k < 8; ++k) v *= 1.5f;
    w = v;
  }
  expect_close(values(t), want, {0, 0}, "x * 1.5^8");
}

// A host batch reaches the device through to_device/upload: a copy that keeps
// every bit on another device, and the very same tensor (nothing copied) on
// the host, which is what a CPU training step relies on.
TEST_P(Elementwise, HostTensorsReachTheDevice) {
  const Tensor host = make({2, 7}, DType::I32, randn(14, 8, 1000.0));
  Tensor on_dev = ops::to_device(host, dev());
  EXPECT_EQ(on_dev.device(), dev());
  EXPECT_EQ(on_dev.raw() == host.raw(), dev() == kHost);
  Tensor next = make({2, 7}, DType::I32, randn(14, 9, 1000.0));
  ops::upload(on_dev, next);
  std::vector<int32_t> back(14);
  ops::copy_bytes_to_host(on_dev, back.data());
  EXPECT_EQ(std::memcmp(back.data(), next.raw(), next.nbytes()), 0);
  ops::upload(on_dev, on_dev.on_host() ? on_dev : next);  // itself: nothing to copy
  EXPECT_THROW(ops::upload(on_dev, make({3, 7}, DType::I32, randn(21, 10))), InternalError);
}

TEST_P(Elementwise, RejectsShapeMismatch) {
  Tensor a = Tensor::empty({4}, DType::F32, dev()), b = Tensor::empty({5}, DType::F32, dev());
  EXPECT_THROW(ops::add(a, a, b), InternalError);
  EXPECT_THROW(ops::convert(a, b), InternalError);
}

}  // namespace
}  // namespace nk
