#include "apps/token_json.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "data/utf8.h"

namespace nk {

void put_token_json(nlohmann::ordered_json& j, const Tokenizer& tok, int32_t id) {
  if (id < 0 || id >= tok.vocab_size()) {
    j["token"] = j["bytes"] = nullptr;
    return;
  }
  const std::string b = tok.token_bytes(id);
  j["token"] = replace_invalid_utf8(b);
  std::vector<int> bytes;
  for (unsigned char c : b) bytes.push_back(c);
  j["bytes"] = bytes;
}

nlohmann::ordered_json logprob_json(nlohmann::ordered_json j, const Tokenizer& tok, int32_t id,
                                    double logprob, const std::vector<TokenLogprob>& top) {
  j["id"] = id;
  put_token_json(j, tok, id);
  j["logprob"] = logprob;
  j["top_logprobs"] = nlohmann::ordered_json::array();
  for (const TokenLogprob& t : top) {
    nlohmann::ordered_json a;
    a["id"] = t.token;
    put_token_json(a, tok, t.token);
    a["logprob"] = t.logprob;
    j["top_logprobs"].push_back(std::move(a));
  }
  return j;
}

std::string logprob_line(int64_t index, const nlohmann::ordered_json& j) {
  std::string line = fmt::format("{:>6} {:>7} {:<14} {:>11.6f}", index, j["id"].get<int>(),
                                 j["token"].dump(), j["logprob"].get<double>());
  for (const auto& a : j["top_logprobs"])
    line += fmt::format("  {} {} {:.6f}", a["id"].get<int>(), a["token"].dump(),
                        a["logprob"].get<double>());
  return line;
}

}  // namespace nk
