// The model step split into stages (embedding, a range of blocks, head +
// loss, each with its backward), as a pipeline stage runs it: two "stages"
// with their own activations, handing the residual stream forward and its
// gradient back, reproduce forward_backward bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "core/rng.h"
#include "model/tiny_config.h"
#include "model/transformer.h"
#include "tensor_util.h"
#include "test_util.h"

namespace nk {
namespace {

using test::host;
using test::random_ids;

void copy(Tensor dst, const Tensor& src) {
  ops::convert(dst, src);
}

void check_pipeline_handoff(const ModelConfig& cfg, DType dt) {
  const int64_t B = 2, T = 12;
  Tensor tokens = random_ids({B, T}, cfg.vocab_size, 1);
  Tensor targets = random_ids({B, T}, cfg.vocab_size, 2);

  Transformer whole(cfg, dt, 3);
  Activations a(cfg, dt, B, T, true);
  whole.zero_grads();
  const float want_loss = whole.forward_backward(a, tokens, targets, 0.5f);
  const std::vector<float> want = host(whole.grads());

  // Stage 0 runs the embedding and layer 0, stage 1 layer 1 and the head;
  // each has its own activations, as on two ranks.
  Transformer model(cfg, dt, 3);
  Activations s0(cfg, dt, B, T, true), s1(cfg, dt, B, T, true);
  model.zero_grads();
  model.embed_forward(s0, tokens);
  model.blocks_forward(s0, 0, 1);
  copy(s1.residual(1), s0.residual(1));  // send forward
  model.blocks_forward(s1, 1, 2);
  const float loss = model.head_loss(s1, targets, true, 0.5f);
  model.blocks_backward(s1, 1, 2);
  copy(s0.residual_grad(), s1.residual_grad());  // send backward
  model.blocks_backward(s0, 0, 1);
  model.embed_backward(s0, tokens);

  EXPECT_EQ(std::memcmp(&loss, &want_loss, sizeof loss), 0) << loss << " vs " << want_loss;
  const std::vector<float> got = host(model.grads());
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << "gradients differ from forward_backward";
  // The stages' forward alone gives forward_loss's value.
  Activations inf(cfg, dt, B, T, false);
  model.embed_forward(inf, tokens);
  model.blocks_forward(inf, 0, 2);
  const float fl = model.head_loss(inf, targets, false, 0.f);
  EXPECT_EQ(fl, model.forward_loss(inf, tokens, targets));
}

TEST(Stages, GptPipelineHandoffEqualsForwardBackward) {
  check_pipeline_handoff(test::tiny_config(false, 64, 16), DType::F32);
}

TEST(Stages, LlamaPipelineHandoffEqualsForwardBackwardBf16) {
  check_pipeline_handoff(test::tiny_config(true, 64, 16), DType::BF16);
}

TEST(Stages, RangesAreChecked) {
  ModelConfig cfg = test::tiny_config(true, 64, 16);
  Transformer model(cfg, DType::F32, 3);
  Activations a(cfg, DType::F32, 1, 4, true), inf(cfg, DType::F32, 1, 4, false);
  EXPECT_THROW(model.blocks_forward(a, 1, 3), std::exception);
  EXPECT_THROW(model.blocks_forward(a, 2, 1), std::exception);
  EXPECT_THROW(model.blocks_backward(inf, 0, 1), std::exception);
  EXPECT_THROW(a.residual(3), std::exception);
}

}  // namespace
}  // namespace nk
