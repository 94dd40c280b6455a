#include "serve/engine_mirror.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/error.h"

namespace nk {

namespace {

using nlohmann::json;

json request_json(const GenerationRequest& r) {
  const SamplingConfig& s = r.sampling;
  return {{"prompt", r.prompt},
          {"max_new_tokens", r.max_new_tokens},
          {"stop", r.stop},
          {"stop_at_eos", r.stop_at_eos},
          {"temperature", s.temperature},
          {"top_k", s.top_k},
          {"top_p", s.top_p},
          {"seed", s.seed},
          {"min_p", s.min_p},
          {"repetition_penalty", s.repetition_penalty},
          {"presence_penalty", s.presence_penalty},
          {"frequency_penalty", s.frequency_penalty},
          {"logprobs", r.logprobs},
          {"top_logprobs", r.top_logprobs}};
}

GenerationRequest request_from(const json& j) {
  GenerationRequest r;
  r.prompt = j.at("prompt").get<std::vector<int32_t>>();
  r.max_new_tokens = j.at("max_new_tokens").get<int64_t>();
  r.stop = j.at("stop").get<std::vector<std::string>>();
  r.stop_at_eos = j.at("stop_at_eos").get<bool>();
  SamplingConfig& s = r.sampling;
  s.temperature = j.at("temperature").get<double>();
  s.top_k = j.at("top_k").get<int64_t>();
  s.top_p = j.at("top_p").get<double>();
  s.seed = j.at("seed").get<uint64_t>();
  s.min_p = j.at("min_p").get<double>();
  s.repetition_penalty = j.at("repetition_penalty").get<double>();
  s.presence_penalty = j.at("presence_penalty").get<double>();
  s.frequency_penalty = j.at("frequency_penalty").get<double>();
  r.logprobs = j.at("logprobs").get<bool>();
  r.top_logprobs = j.at("top_logprobs").get<int64_t>();
  return r;
}

// One record from rank 0 to every rank of the group: its size, then its bytes.
std::string broadcast_record(dist::Communicator& group, std::string text) {
  int64_t n = int64_t(text.size());
  group.broadcast(Tensor::from_blob(&n, Shape{1}, DType::I64), 0);
  text.resize(size_t(n));
  if (n > 0) group.broadcast(Tensor::from_blob(text.data(), Shape{n}, DType::U8), 0);
  return text;
}

}  // namespace

EngineMirror::EngineMirror(dist::Communicator& group,
                           std::function<void(const std::string&)> end_job)
    : group_(group), end_job_(std::move(end_job)) {
  NK_CHECK(group.rank() == 0, "EngineMirror on rank {} of '{}'", group.rank(), group.name());
}

std::chrono::milliseconds EngineMirror::heartbeat() const {
  const double s = std::clamp(group_.timeout() / 4, 0.05, 5.0);
  return std::chrono::milliseconds(int64_t(s * 1000));
}

void EngineMirror::submitted(const GenerationRequest& r) {
  ops_.push_back({{"submit", request_json(r)}});
}

void EngineMirror::cancelled(int64_t id) {
  ops_.push_back({{"cancel", id}});
}

void EngineMirror::released(int64_t id) {
  ops_.push_back({{"release", id}});
}

void EngineMirror::send(Then then) {
  const json record = {{"ops", std::exchange(ops_, json::array())},
                       {"then", then == Then::Step   ? "step"
                                : then == Then::Stop ? "stop"
                                                     : ""}};
  broadcast_record(group_, record.dump());
}

void EngineMirror::failed(const std::string& why) {
  const std::string msg = "nekton serve: the tensor-parallel group cannot go on: " + why;
  if (end_job_) end_job_(msg);
  std::fprintf(stderr, "%s\n", msg.c_str());
  std::abort();  // end_job_ returned: nothing else can stop the other ranks
}

void follow_engine(Generator& gen, dist::Communicator& group) {
  NK_CHECK(group.rank() != 0, "follow_engine on rank 0 of '{}'", group.name());
  for (;;) {
    const json record = json::parse(broadcast_record(group, std::string()));
    for (const json& op : record.at("ops")) {
      if (op.contains("submit")) {
        gen.submit(request_from(op.at("submit")));
      } else if (op.contains("cancel")) {
        gen.cancel(op.at("cancel").get<int64_t>());
      } else {
        gen.release(op.at("release").get<int64_t>());
      }
    }
    const std::string then = record.at("then").get<std::string>();
    if (then == "stop") return;
    if (then == "step") gen.step();
  }
}

}  // namespace nk
