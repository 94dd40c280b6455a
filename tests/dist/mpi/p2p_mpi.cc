// Point-to-point: a ring of non-blocking sends and receives, tags keeping two
// messages between the same pair apart, and a short message caught.
#include "dist/communicator.h"
#include "mpi_env.h"
#include "tensors.h"
#include "test_util.h"

namespace nk::test {
namespace {

dist::Communicator& world() {
  return layout(dist::MeshSpec{}).groups.get("world");
}

TEST(PointToPoint, RingPassesEveryRanksData) {
  auto& c = world();
  int p = c.size(), r = c.rank(), n = 1 << 16;  // large enough for MPI's rendezvous protocol
  int next = (r + 1) % p, prev = (r + p - 1) % p;
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor mine = tensor_f32(std::vector<float>(n, float(r)), dt);
    Tensor got = Tensor::zeros({n}, dt);
    // Post the receive first and both before waiting: a blocking send first would deadlock
    // on large messages.
    auto rx = c.recv_async(got, prev);
    auto tx = c.send_async(mine, next);
    tx->wait();
    rx->wait();
    for (float v : values(got)) ASSERT_EQ(v, float(prev));
  }
}

TEST(PointToPoint, TagsMatchMessagesOutOfOrder) {
  auto& c = world();
  int p = c.size(), r = c.rank();
  int next = (r + 1) % p, prev = (r + p - 1) % p;
  Tensor a = tensor_f32({1, 2, 3}), b = tensor_f32({4, 5});
  Tensor ga = Tensor::zeros({3}, DType::F32), gb = Tensor::zeros({2}, DType::F32);
  auto sa = c.send_async(a, next, 7);
  auto sb = c.send_async(b, next, 9);
  c.recv(gb, prev, 9);  // the later message first
  c.recv(ga, prev, 7);
  sa->wait();
  sb->wait();
  EXPECT_EQ(values(ga), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(values(gb), (std::vector<float>{4, 5}));
}

TEST(PointToPoint, ShortMessageIsAnError) {
  auto& c = world();
  int p = c.size(), r = c.rank();
  int next = (r + 1) % p, prev = (r + p - 1) % p;
  Tensor four = Tensor::zeros({4}, DType::F32), five = Tensor::zeros({5}, DType::F32);
  auto tx = c.send_async(four, next, 3);
  auto msg = error_of([&] { c.recv(five, prev, 3); });
  tx->wait();
  EXPECT_TRUE(contains(msg, fmt::format("group 'world' recv #")));
  EXPECT_TRUE(contains(msg, fmt::format("received 4 elements from rank {}, the buffer f32[5] "
                                        "expects 5",
                                        prev)))
      << msg;
  EXPECT_TRUE(contains(error_of([&] { c.send(four, r); }), "send to itself"));
}

}  // namespace
}  // namespace nk::test
