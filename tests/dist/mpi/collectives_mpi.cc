// Every collective of the MPI communicator over the world group, against values
// computed locally. Data are small integers (exact in bf16 and in any
// summation order) unless a test says otherwise.
#include <numeric>

#include "dist/communicator.h"
#include "dist/strings.h"
#include "mpi_env.h"
#include "tensors.h"
#include "test_util.h"

namespace nk::test {
namespace {

using dist::ReduceOp;

dist::Communicator& world() {
  return layout(dist::MeshSpec{}).groups.get("world");
}

// Rank r's i-th value: r + i % 7.
std::vector<float> rank_data(int r, int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = float(r + i % 7);
  return v;
}

class Collectives : public ::testing::TestWithParam<DType> {};

TEST_P(Collectives, AllReduceSumAvgMax) {
  auto& c = world();
  int p = c.size(), r = c.rank(), n = 1000;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    if (op == ReduceOp::Avg && (GetParam() == DType::I32 || GetParam() == DType::I64)) continue;
    Tensor x = tensor_f32(rank_data(r, n), GetParam());
    c.all_reduce(x, op);
    auto got = values(x);
    for (int i = 0; i < n; ++i) {
      float sum = float(p * (p - 1) / 2 + p * (i % 7));
      float want = op == ReduceOp::Sum ? sum : op == ReduceOp::Avg ? sum / p : float(p - 1 + i % 7);
      if (GetParam() == DType::BF16) want = bf16_to_f32(f32_to_bf16(want));
      ASSERT_EQ(got[i], want) << dist::reduce_op_name(op) << " element " << i;
    }
  }
}

TEST_P(Collectives, ReduceScatter) {
  auto& c = world();
  int p = c.size(), r = c.rank(), n = 37;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    if (op == ReduceOp::Avg && (GetParam() == DType::I32 || GetParam() == DType::I64)) continue;
    Tensor in = tensor_f32(rank_data(r, p * n), GetParam());
    Tensor out = Tensor::zeros({n}, GetParam());
    c.reduce_scatter(in, out, op);
    auto got = values(out);
    for (int i = 0; i < n; ++i) {
      int g = r * n + i;  // this rank's block of the full vector
      float sum = float(p * (p - 1) / 2 + p * (g % 7));
      ASSERT_EQ(got[i], op == ReduceOp::Sum ? sum : sum / p) << i;
    }
  }
}

TEST_P(Collectives, AllGather) {
  auto& c = world();
  int p = c.size(), r = c.rank(), n = 5;
  Tensor in = tensor_f32(rank_data(r, n), GetParam());
  Tensor out = Tensor::zeros({p, n}, GetParam());
  c.all_gather(in, out);
  auto got = values(out);
  for (int j = 0; j < p; ++j)
    for (int i = 0; i < n; ++i) ASSERT_EQ(got[j * n + i], float(j + i % 7));
}

// Uneven blocks (one of them empty on 4 ranks), in place.
std::vector<int64_t> uneven_counts(int p) {
  std::vector<int64_t> c(static_cast<size_t>(p));
  for (int j = 0; j < p; ++j) c[size_t(j)] = (3 * j + 1) % 5;
  return c;
}

TEST_P(Collectives, ReduceScatterVInPlace) {
  auto& c = world();
  int p = c.size(), r = c.rank();
  auto counts = uneven_counts(p);
  int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  int64_t at = std::accumulate(counts.begin(), counts.begin() + r, int64_t(0));
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    if (op == ReduceOp::Avg && (GetParam() == DType::I32 || GetParam() == DType::I64)) continue;
    Tensor x = tensor_f32(rank_data(r, int(n)), GetParam());
    c.reduce_scatter_v(x, counts, op);
    auto got = values(x);
    for (int64_t i = at; i < at + counts[size_t(r)]; ++i) {
      float sum = float(p * (p - 1) / 2 + p * (i % 7));
      ASSERT_EQ(got[size_t(i)], op == ReduceOp::Sum ? sum : sum / p) << "element " << i;
    }
  }
}

TEST_P(Collectives, AllGatherVInPlace) {
  auto& c = world();
  int p = c.size(), r = c.rank();
  auto counts = uneven_counts(p);
  int64_t n = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  int64_t at = std::accumulate(counts.begin(), counts.begin() + r, int64_t(0));
  // Only this rank's block is set; the rest is garbage that must be replaced.
  std::vector<float> v(size_t(n), -1.f);
  for (int64_t i = at; i < at + counts[size_t(r)]; ++i) v[size_t(i)] = float(10 * r + i % 7);
  Tensor x = tensor_f32(v, GetParam());
  c.all_gather_v(x, counts);
  auto got = values(x);
  int64_t i = 0;
  for (int j = 0; j < p; ++j)
    for (int64_t k = 0; k < counts[size_t(j)]; ++k, ++i)
      ASSERT_EQ(got[size_t(i)], float(10 * j + i % 7)) << "block " << j << " element " << i;
}

TEST_P(Collectives, AllToAll) {
  auto& c = world();
  int p = c.size(), r = c.rank(), n = 3;
  // Block j of rank r holds 10·r + j: rank j receives 10·src + j from every src.
  std::vector<float> v(p * n);
  for (int j = 0; j < p; ++j)
    for (int i = 0; i < n; ++i) v[j * n + i] = float(10 * r + j);
  Tensor in = tensor_f32(v, GetParam()), out = Tensor::zeros({p * n}, GetParam());
  c.all_to_all(in, out);
  auto got = values(out);
  for (int src = 0; src < p; ++src)
    for (int i = 0; i < n; ++i) ASSERT_EQ(got[src * n + i], float(10 * src + r));
}

TEST_P(Collectives, Broadcast) {
  auto& c = world();
  int p = c.size(), r = c.rank();
  Tensor x = tensor_f32(rank_data(r, 11), GetParam());
  c.broadcast(x, p - 1);
  EXPECT_EQ(values(x), rank_data(p - 1, 11));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Collectives,
                         ::testing::Values(DType::F32, DType::BF16, DType::F64, DType::I32,
                                           DType::I64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Rank r sends (r + 2j) % 3 rows of width 3 to rank j (zero rows included);
// row k of that message holds 16·r + 4·j + k in every column (exact in bf16). The counts
// are first exchanged with an i64 all_to_all, as MoE dispatch does.
TEST(CollectivesV, AllToAllvUnevenRows) {
  auto& c = world();
  int p = c.size(), r = c.rank(), width = 3;
  auto rows = [](int src, int dst) { return int64_t((src + 2 * dst) % 3); };
  std::vector<float> send_counts(p);
  std::vector<float> data;
  for (int j = 0; j < p; ++j) {
    send_counts[j] = float(rows(r, j));
    for (int k = 0; k < rows(r, j); ++k)
      for (int col = 0; col < width; ++col) data.push_back(float(16 * r + 4 * j + k));
  }
  Tensor counts_in = tensor_f32(send_counts, DType::I64),
         counts_out = Tensor::zeros({p}, DType::I64);
  c.all_to_all(counts_in, counts_out);
  std::vector<int64_t> send(p), recv(p);
  for (int j = 0; j < p; ++j) {
    send[j] = rows(r, j);
    recv[j] = counts_out.data<int64_t>()[j];
    ASSERT_EQ(recv[j], rows(j, r));
  }
  int64_t total_in = std::accumulate(send.begin(), send.end(), int64_t(0));
  int64_t total_out = std::accumulate(recv.begin(), recv.end(), int64_t(0));
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor in = tensor_f32(data, dt).view({total_in, width});
    Tensor out = Tensor::zeros({total_out, width}, dt);
    c.all_to_allv(in, send, out, recv);
    auto got = values(out);
    size_t at = 0;
    for (int src = 0; src < p; ++src)
      for (int k = 0; k < rows(src, r); ++k)
        for (int col = 0; col < width; ++col, ++at)
          ASSERT_EQ(got[at], float(16 * src + 4 * r + k)) << "from " << src << " row " << k;
    EXPECT_EQ(at, got.size());
  }
}

// Several operations in flight at once, waited out of order, then polled.
// Byte strings of every length, empty ones and NUL bytes included: rank r
// sends rank j "r>j" repeated j times (nothing to rank 0), and gathers r
// copies of "r\0" (nothing from rank 0).
TEST(CollectivesStrings, ExchangeAndAllGatherKeepEveryRanksBytes) {
  auto& c = world();
  const int p = c.size(), r = c.rank();
  auto piece = [](int from, int to) {
    std::string s;
    for (int i = 0; i < to; ++i) s += fmt::format("{}>{};", from, to);
    return s;
  };
  std::vector<std::string> send;
  for (int j = 0; j < p; ++j) send.push_back(piece(r, j));
  const std::vector<std::string> got = dist::exchange_strings(c, send);
  ASSERT_EQ(int(got.size()), p);
  for (int j = 0; j < p; ++j) EXPECT_EQ(got[size_t(j)], piece(j, r)) << "from rank " << j;
  auto mine = [](int k) {
    std::string s;
    for (int i = 0; i < k; ++i) s += std::to_string(k) + '\0';
    return s;
  };
  const std::vector<std::string> all = dist::all_gather_strings(c, mine(r));
  ASSERT_EQ(int(all.size()), p);
  for (int j = 0; j < p; ++j) EXPECT_EQ(all[size_t(j)], mine(j)) << "rank " << j;
  // Nothing anywhere.
  EXPECT_EQ(dist::all_gather_strings(c, ""), std::vector<std::string>(size_t(p)));
  EXPECT_EQ(dist::exchange_strings(c, std::vector<std::string>(size_t(p))),
            std::vector<std::string>(size_t(p)));
}

TEST(CollectivesAsync, ManyInFlightWaitedInAnyOrder) {
  auto& c = world();
  int p = c.size(), r = c.rank(), n = 4096;
  std::vector<Tensor> xs;
  std::vector<dist::WorkPtr> works;
  for (int k = 0; k < 4; ++k) {
    std::vector<float> v(n, float(r + k));
    xs.push_back(tensor_f32(v, k % 2 ? DType::BF16 : DType::F32));
    works.push_back(c.all_reduce_async(xs.back()));
  }
  Tensor gin = tensor_f32({float(r)}), gout = Tensor::zeros({p}, DType::F32);
  auto gather = c.all_gather_async(gin, gout);
  auto barrier = c.barrier_async();
  gather->wait();
  for (int k = 3; k >= 0; --k) works[k]->wait();
  while (!barrier->test()) {
  }
  barrier->wait();  // idempotent
  for (int k = 0; k < 4; ++k)
    for (float v : values(xs[k])) ASSERT_EQ(v, float(p * (p - 1) / 2 + p * k)) << k;
  for (int j = 0; j < p; ++j) EXPECT_EQ(gout.data<float>()[j], float(j));
}

// 16-bit reductions stage through f32 buffers that completed works give
// back for reuse: sizes up and down, several in flight at once (each needs
// its own buffer), reduce-scatters among them, and every sum exact whatever
// a reused buffer held before.
TEST(CollectivesBf16, ReusedStagingBuffersGiveExactSums) {
  auto& c = world();
  const int p = c.size(), r = c.rank();
  for (int round = 0; round < 3; ++round)
    for (int64_t n : {int64_t(1) << 18, int64_t(7), int64_t(1) << 12, int64_t(1) << 19}) {
      std::vector<Tensor> xs;
      std::vector<dist::WorkPtr> works;
      for (int k = 0; k < 6; ++k) {  // more than the pool keeps
        xs.push_back(tensor_f32(std::vector<float>(size_t(n), float(r + k + round)), DType::BF16));
        works.push_back(c.all_reduce_async(xs.back()));
      }
      Tensor in = tensor_f32(std::vector<float>(size_t(n * p), float(r + 1)), DType::BF16);
      Tensor out = Tensor::zeros({n}, DType::BF16);
      c.reduce_scatter(in, out);
      for (auto& w : works) w->wait();
      for (int k = 0; k < 6; ++k)
        for (float v : values(xs[size_t(k)]))
          ASSERT_EQ(v, float(p * (p - 1) / 2 + p * (k + round))) << n << " " << k;
      for (float v : values(out)) ASSERT_EQ(v, float(p * (p + 1) / 2)) << n;
    }
}

// f32 sums of non-integers: the closed form within f32 rounding.
TEST(CollectivesF32, AllReduceMatchesClosedFormSum) {
  auto& c = world();
  int p = c.size(), r = c.rank(), n = 257;
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = 0.1f * float(r + 1) + 0.001f * float(i);
  Tensor x = tensor_f32(v);
  c.all_reduce(x);
  for (int i = 0; i < n; ++i) {
    double want = 0.1 * p * (p + 1) / 2.0 + 0.001 * i * p;
    EXPECT_NEAR(x.data<float>()[i], want, 1e-5 * want) << i;
  }
}

// bf16 sums accumulate in f32 and round once: rank 0 holds 256, the others 1.
// With 4 ranks the sum 259 rounds to 260 (ties to even); rounding after every
// step would lose each 1 against 256 and give 256.
TEST(CollectivesBf16, SumsRoundOnce) {
  auto& c = world();
  int p = c.size();
  Tensor x = tensor_f32({c.rank() == 0 ? 256.f : 1.f}, DType::BF16);
  c.all_reduce(x);
  const float want = bf16_to_f32(f32_to_bf16(float(256 + p - 1)));
  EXPECT_EQ(values(x)[0], want);
  // The reduce-scatters alike (staged through f32 as the all-reduce is):
  // every rank's block holds the same sum, rounded once.
  std::vector<float> v(size_t(p), c.rank() == 0 ? 256.f : 1.f);
  Tensor in = tensor_f32(v, DType::BF16), out = Tensor::zeros({1}, DType::BF16);
  c.reduce_scatter(in, out);
  EXPECT_EQ(values(out)[0], want);
  c.reduce_scatter_v(in, std::vector<int64_t>(size_t(p), 1));
  EXPECT_EQ(values(in)[size_t(c.rank())], want);
}

// A Work dropped without wait() completes in its destructor; buffers stay alive.
TEST(CollectivesAsync, DroppedWorkCompletes) {
  auto& c = world();
  Tensor x = tensor_f32(std::vector<float>(64, 1.f));
  c.all_reduce_async(x);
  c.all_reduce_async(tensor_f32({2.f}));  // its only reference is the Work's
  for (float v : values(x)) ASSERT_EQ(v, float(c.size()));
}

TEST(CollectivesErrors, BadArgumentsNameRankGroupAndOp) {
  auto& c = world();
  int p = c.size();
  Tensor in = Tensor::zeros({3}, DType::F32), out = Tensor::zeros({3 * p + 1}, DType::F32);
  auto msg = error_of([&] { c.all_gather(in, out); });
  EXPECT_TRUE(contains(msg, fmt::format("rank {} (world {}), group 'world' all_gather: out f32[{}] "
                                        "must hold {} × in f32[3]",
                                        c.rank(), c.rank(), 3 * p + 1, p)))
      << msg;
  Tensor ints = Tensor::zeros({4}, DType::I32);
  EXPECT_TRUE(contains(error_of([&] { c.all_reduce(ints, ReduceOp::Avg); }), "avg of integer x"));
  std::vector<int64_t> two(2, 0);
  if (p != 2) {
    EXPECT_TRUE(contains(error_of([&] { c.all_to_allv(in, two, in, two); }),
                         fmt::format("2 send and 2 receive counts for a group of {}", p)));
  }
  std::vector<int64_t> ones(static_cast<size_t>(p), 1);  // p elements for a buffer of 3
  if (p != 3) {
    EXPECT_TRUE(
        contains(error_of([&] { c.reduce_scatter_v(in, ones); }),
                 fmt::format("reduce_scatter_v: counts add up to {} elements, x is f32[3]", p)));
    EXPECT_TRUE(contains(error_of([&] { c.all_gather_v(in, ones); }),
                         fmt::format("all_gather_v: counts add up to {} elements", p)));
  }
  EXPECT_TRUE(contains(error_of([&] { c.broadcast(in, p); }), "peer rank"));
  EXPECT_TRUE(contains(error_of([&] { c.set_timeout(0); }), "the timeout must be positive"));
}

}  // namespace
}  // namespace nk::test
