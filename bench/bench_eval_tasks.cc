// Documents/s of `nekton eval tasks`' log-likelihood back end
// (eval/eval_model.h, LocalEvalModel::score) on a multiple-choice task:
// every request at once, sorted by length and scored BATCH rows per
// forward, against one request per forward, in the same process on the
// same requests. A randomly initialised PRESET with a 257-row head (the byte
// tokenizer's ids) so the blocks, not the vocabulary, carry the cost. Usage:
//   bench_eval_tasks PRESET BATCH DOCS CHOICES CONTEXT CONTINUATION
// (threads from OMP_NUM_THREADS; context and continuation lengths vary by
// up to a quarter per document, as real prompts do). Prints both rates, the
// ratio and the largest log-likelihood difference between the two runs.
//   bench_eval_tasks --save PRESET DIR
// writes the same randomly initialised PRESET (vocab 257, f32) with the byte
// tokenizer as a model folder, for timing `nekton eval tasks` end to end.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdlib>

#include "ckpt/model_io.h"
#include "core/rng.h"
#include "data/tokenizer/tokenizer.h"
#include "eval/eval_model.h"

using namespace nk;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--save") {
    ModelConfig cfg = model_preset(argv[2]);
    cfg.vocab_size = 257;
    Transformer model(cfg, DType::F32, 1);
    save_model(argv[3], model);
    store_tokenizer("bytes", argv[3]);
    fmt::print("{} (vocab 257): {:.3f}B parameters in {}\n", argv[2],
               double(model.layout().count()) / 1e9, argv[3]);
    return 0;
  }
  if (argc < 7) {
    fmt::print(stderr, "usage: bench_eval_tasks PRESET BATCH DOCS CHOICES CONTEXT CONTINUATION\n");
    return 1;
  }
  ModelConfig cfg = model_preset(argv[1]);
  cfg.vocab_size = 257;
  const int64_t B = std::atoll(argv[2]), D = std::atoll(argv[3]), C = std::atoll(argv[4]);
  const int64_t ctx = std::atoll(argv[5]), cont = std::atoll(argv[6]);
  Transformer model(cfg, DType::F32, 1);
  std::unique_ptr<Tokenizer> tok = load_tokenizer("bytes");
  Rng rng(3);
  auto around = [&](int64_t n) { return n - n / 4 + int64_t(rng.below(uint64_t(n / 2 + 1))); };
  std::vector<LocalEvalModel::TokenRequest> reqs;
  for (int64_t d = 0; d < D; ++d) {
    std::vector<int32_t> context(size_t(around(ctx)));
    for (auto& t : context) t = int32_t(rng.below(256));
    for (int64_t c = 0; c < C; ++c) {
      LocalEvalModel::TokenRequest r;
      r.cont.resize(size_t(around(cont)));
      for (auto& t : r.cont) t = int32_t(rng.below(256));
      r.input = context;
      r.input.insert(r.input.end(), r.cont.begin(), r.cont.end() - 1);
      reqs.push_back(std::move(r));
    }
  }
  auto run = [&](int64_t batch, std::vector<LoglikelihoodResult>& out) {
    LocalEvalModel lm(model, *tok, batch);
    lm.score({reqs.begin(), reqs.begin() + std::min<int64_t>(C, int64_t(reqs.size()))});  // warm-up
    const auto t0 = Clock::now();
    out = lm.score(reqs);
    return double(D) / std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::vector<LoglikelihoodResult> one, batched;
  const double r1 = run(1, one), rb = run(B, batched);
  double diff = 0;
  for (size_t i = 0; i < one.size(); ++i)
    diff = std::max(diff, std::abs(one[i].logprob - batched[i].logprob));
  fmt::print(
      "{} (vocab 257), {} documents x {} choices, context ~{} + continuation ~{} tokens\n"
      "one request per forward: {:.2f} documents/s\nbatch {}: {:.2f} documents/s ({:.2f}x)\n"
      "largest log-likelihood difference {:.2e}\n",
      argv[1], D, C, ctx, cont, r1, B, rb, rb / r1, diff);
  return 0;
}
