// The NCCL communicator against the same closed forms as the MPI one, on CUDA
// buffers (one GPU per rank; skipped where there are fewer GPUs than ranks).
// Compiled only with -DNK_WITH_NCCL=ON.
#ifdef NK_WITH_NCCL
#include <cuda_runtime.h>

#include "dist/nccl/nccl_groups.h"
#include "mpi_env.h"
#include "tensors.h"
#include "test_util.h"

namespace nk::test {
namespace {

// A CUDA copy of a host tensor, freed with the returned holder.
struct DeviceTensor {
  Tensor t;
  void* ptr = nullptr;
  explicit DeviceTensor(const Tensor& host) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(host.nbytes(), 1)), cudaSuccess);
    cudaMemcpy(ptr, host.raw(), host.nbytes(), cudaMemcpyHostToDevice);
    t = Tensor::from_blob(ptr, host.shape(), host.dtype(), Device::CUDA);
  }
  ~DeviceTensor() { cudaFree(ptr); }
  Tensor to_host() const {
    Tensor h = Tensor::empty(t.shape(), t.dtype());
    cudaMemcpy(h.raw(), ptr, t.nbytes(), cudaMemcpyDeviceToHost);
    return h;
  }
};

dist::ProcessGroups* nccl_groups() {
  static std::unique_ptr<dist::ProcessGroups> groups;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < mpi().world_size()) return nullptr;
  if (!groups)
    groups = std::make_unique<dist::ProcessGroups>(
        dist::make_nccl_groups(layout(dist::MeshSpec{}).groups, mpi().rank() % devices));
  return groups.get();
}

#define NK_NEED_GPUS()          \
  auto* groups = nccl_groups(); \
  if (!groups) GTEST_SKIP() << "needs one CUDA device per rank"

TEST(Nccl, AllReduceGatherBroadcastRing) {
  NK_NEED_GPUS();
  auto& c = groups->get("world");
  int p = c.size(), r = c.rank();
  for (DType dt : {DType::F32, DType::BF16}) {
    DeviceTensor x(tensor_f32(std::vector<float>(100, float(r + 1)), dt));
    c.all_reduce(x.t);
    for (float v : values(x.to_host())) ASSERT_EQ(v, float(p * (p + 1) / 2));
  }
  DeviceTensor in(tensor_f32({float(r)})), out(Tensor::zeros({p}, DType::F32));
  c.all_gather(in.t, out.t);
  for (int j = 0; j < p; ++j) EXPECT_EQ(values(out.to_host())[j], float(j));
  DeviceTensor b(tensor_f32({float(r), 7}));
  c.broadcast(b.t, p - 1);
  EXPECT_EQ(values(b.to_host()), (std::vector<float>{float(p - 1), 7}));
  if (p > 1) {
    DeviceTensor mine(tensor_f32({float(r)})), got(Tensor::zeros({1}, DType::F32));
    auto rx = c.recv_async(got.t, (r + p - 1) % p);
    c.send(mine.t, (r + 1) % p);
    rx->wait();
    EXPECT_EQ(values(got.to_host())[0], float((r + p - 1) % p));
  }
  c.barrier();
}

// The distributed optimizer's uneven in-place collectives (one empty block on 4 ranks).
TEST(Nccl, ReduceScatterVAndAllGatherVInPlace) {
  NK_NEED_GPUS();
  auto& c = groups->get("world");
  int p = c.size(), r = c.rank();
  std::vector<int64_t> counts(static_cast<size_t>(p));
  for (int j = 0; j < p; ++j) counts[size_t(j)] = (3 * j + 1) % 5;
  int64_t n = 0, at = 0;
  for (int j = 0; j < p; ++j) {
    if (j < r) at += counts[size_t(j)];
    n += counts[size_t(j)];
  }
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(r + i % 7);
  DeviceTensor x(tensor_f32(v));
  c.reduce_scatter_v(x.t, counts);
  auto got = values(x.to_host());
  for (int64_t i = at; i < at + counts[size_t(r)]; ++i)
    ASSERT_EQ(got[size_t(i)], float(p * (p - 1) / 2 + p * (i % 7))) << i;
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = i >= at && i < at + counts[size_t(r)] ? float(10 * r) : -1.f;
  DeviceTensor y(tensor_f32(v));
  c.all_gather_v(y.t, counts);
  got = values(y.to_host());
  int64_t i = 0;
  for (int j = 0; j < p; ++j)
    for (int64_t k = 0; k < counts[size_t(j)]; ++k, ++i)
      ASSERT_EQ(got[size_t(i)], float(10 * j)) << i;
}

TEST(Nccl, AllToAllvUnevenRows) {
  NK_NEED_GPUS();
  auto& c = groups->get("world");
  int p = c.size(), r = c.rank();
  std::vector<int64_t> send(p), recv(p);
  std::vector<float> data;
  for (int j = 0; j < p; ++j) {
    send[j] = (r + j) % 2 + 1;
    recv[j] = (j + r) % 2 + 1;
    for (int k = 0; k < send[j]; ++k) data.push_back(float(16 * r + 4 * j + k));
  }
  DeviceTensor in(tensor_f32(data));
  int64_t total = 0;
  for (auto n : recv) total += n;
  DeviceTensor out(Tensor::zeros({total}, DType::F32));
  c.all_to_allv(in.t, send, out.t, recv);
  auto got = values(out.to_host());
  size_t at = 0;
  for (int src = 0; src < p; ++src)
    for (int k = 0; k < recv[src]; ++k) EXPECT_EQ(got[at++], float(16 * src + 4 * r + k));
}

}  // namespace
}  // namespace nk::test
#endif
