#include "align/rewards/reward_input.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"

namespace nk {

std::string rollout_name(std::span<const RewardInput> in, size_t i) {
  const std::string& w = in[i].where;
  return w.empty() ? fmt::format("rollout {}", i) : fmt::format("rollout {} ({})", i, w);
}

nlohmann::json grader_input(const RewardInput& in) {
  nlohmann::json o = in.record && in.record->is_object() ? *in.record : nlohmann::json::object();
  o["prompt"] = in.prompt ? *in.prompt : nlohmann::json();
  o["completion"] = in.completion;
  o["completion_tokens"] = in.completion_tokens;
  o["truncated"] = in.truncated;
  return o;
}

double grader_reward(const nlohmann::json& v) {
  const nlohmann::json* x = &v;
  if (v.is_object()) {
    auto it = v.find("reward");
    if (it == v.end()) fail("an object without \"reward\": {}", v.dump());
    x = &*it;
  }
  if (!x->is_number()) fail("not a number: {}", v.dump());
  const double r = x->get<double>();
  if (!std::isfinite(r)) fail("not a finite number: {}", v.dump());
  return r;
}

}  // namespace nk
