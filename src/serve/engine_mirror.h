// The serving engine over a model split by tensor parallelism (serve.tp):
// every rank of the group holds its share of the model and a Generator of
// its own over a KV cache of its heads, and every rank must run each
// decode step together (the model's all-reduces and the logits' gather).
// Rank 0 serves HTTP and owns the Engine; its Engine records each call that
// changes its Generator (submit, cancel, release) and, before each step,
// broadcasts the record to the other ranks, which replay it on their own
// Generator, then step with it (follow_engine). The Generators therefore
// hold the same sequences under the same ids and sample the same tokens
// (the same logits and seeds). While the engine is idle it broadcasts an
// empty record every heartbeat, so the others' waits stay within the
// group's timeout, and at its end one that stops them.
#pragma once
#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/communicator.h"
#include "infer/generate.h"

namespace nk {

class EngineMirror {
 public:
  // `group`: the tensor-parallel group; this rank is its rank 0.
  // `end_job`: ends every rank's process with the message (MpiRuntime::abort);
  // it does not return.
  EngineMirror(dist::Communicator& group, std::function<void(const std::string&)> end_job);
  EngineMirror(const EngineMirror&) = delete;
  EngineMirror& operator=(const EngineMirror&) = delete;

  // How often an idle engine broadcasts (a quarter of the group's timeout,
  // at most 5 s).
  std::chrono::milliseconds heartbeat() const;

  // Records a call made on rank 0's Generator (in the order made).
  void submitted(const GenerationRequest& r);
  void cancelled(int64_t id);
  void released(int64_t id);
  // Broadcasts what was recorded since the last send, then what follows:
  // a step every rank runs now, nothing (a heartbeat), or the end.
  enum class Then { Step, Nothing, Stop };
  void send(Then then);
  // A step or a send failed here: the other ranks' Generators no longer
  // match this one's (or a rank is gone), so the whole job ends.
  [[noreturn]] void failed(const std::string& why);

 private:
  dist::Communicator& group_;
  std::function<void(const std::string&)> end_job_;
  nlohmann::json ops_ = nlohmann::json::array();
};

// Ranks other than 0: replays rank 0's records on `gen` and steps with it,
// until rank 0 sends the end (or a wait passes the group's timeout: an
// nk::Error naming rank 0).
void follow_engine(Generator& gen, dist::Communicator& group);

}  // namespace nk
