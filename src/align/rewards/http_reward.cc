#include "align/rewards/http_reward.h"

#include <optional>

#include "core/error.h"

namespace nk {

HttpReward::HttpReward(std::string url, std::chrono::milliseconds timeout)
    : url_(std::move(url)), parsed_(parse_http_url("align.reward_url", url_)), timeout_(timeout) {}

std::vector<double> HttpReward::score(std::span<const RewardInput> in) {
  if (in.empty()) return {};  // no request for nothing
  const std::string name = fmt::format("align.reward_url '{}'", url_);
  nlohmann::json inputs = nlohmann::json::array();
  for (const RewardInput& x : in) inputs.push_back(grader_input(x));
  HttpPostResult r;
  try {
    r = http_post_json(parsed_,
                       nlohmann::json{{"inputs", std::move(inputs)}}.dump(
                           -1, ' ', false, nlohmann::json::error_handler_t::replace),
                       timeout_);
  } catch (const Error& e) {
    fail("{}: {} (align.reward_timeout_s {} s)", name, e.what(), double(timeout_.count()) / 1000);
  }
  const std::string head = r.body.size() > 300 ? r.body.substr(0, 300) + "..." : r.body;
  if (r.status != 200) fail("{}: HTTP status {} (body: '{}')", name, r.status, head);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(r.body);
  } catch (const nlohmann::json::exception&) {
    fail("{}: the body is not JSON: '{}'", name, head);
  }
  if (!j.is_object() || !j.contains("rewards") || !j["rewards"].is_array())
    fail("{}: the body is not {{\"rewards\": [...]}}: '{}'", name, head);
  const nlohmann::json& rw = j["rewards"];
  if (rw.size() != in.size()) fail("{}: {} rewards for {} inputs", name, rw.size(), in.size());
  std::vector<double> v(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    try {
      v[i] = grader_reward(rw[i]);
    } catch (const Error& e) {
      fail("{}: rewards[{}] (for {}): {}", name, i, rollout_name(in, i), e.what());
    }
  }
  return v;
}

}  // namespace nk
