// The optimizer half of the PyTorch parity tests (torch_parity_test.cc,
// lora_test.cc): a few AdamW steps with global-norm clipping whose losses the
// Python reference repeats from the settings in DIR/optim.json, and the run
// of that reference.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "test_paths.h"
#include "train/adamw.h"

namespace nk::test {

struct ParitySteps {
  AdamWConfig adamw{.weight_decay = 0.1, .precision = {}};
  double lr = 1e-2, clip = 1.0;
  int64_t steps = 5;

  // The loss before each step; writes DIR/optim.json.
  std::vector<float> run(Transformer& model, Activations& acts, const Tensor& tokens,
                         const Tensor& targets, const std::filesystem::path& dir) const {
    AdamW opt(model, adamw);
    std::vector<float> losses;
    for (int64_t s = 0; s < steps; ++s) {
      model.zero_grads();
      losses.push_back(model.forward_backward(acts, tokens, targets, 1.f));
      const double norm = std::sqrt(ops::sum_squares(model.grads()));
      opt.step(lr, norm > clip ? float(clip / norm) : 1.f);
    }
    write_file_atomic(
        (dir / "optim.json").string(),
        fmt::format(R"({{"lr": {}, "beta1": {}, "beta2": {}, "eps": {},
                                      "weight_decay": {}, "grad_clip": {}, "steps": {}}})",
                    lr, adamw.beta1, adamw.beta2, adamw.eps, adamw.weight_decay, clip, steps));
    return losses;
  }
};

// Runs tests/SCRIPT DIR 1e-4 with Debian's python3 (its output shows each check).
inline void expect_python_reference_passes(const std::string& script,
                                           const std::filesystem::path& dir,
                                           const std::string& name) {
  const std::string cmd =
      fmt::format("/usr/bin/python3 {}/tests/{} {} 1e-4 2>&1", NK_SOURCE_DIR, script, dir.string());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << script << " failed for " << name << " (see above)";
}

}  // namespace nk::test
