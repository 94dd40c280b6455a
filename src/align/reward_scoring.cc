#include "align/reward_scoring.h"

#include <fmt/format.h>

#include "align/reward_model.h"
#include "core/error.h"
#include "data/chat/chat_config.h"
#include "infer/model_source.h"

namespace nk {

namespace {

// A template the data may not need (string prompts): its error is given by
// the first chat record that does, naming that record.
class DeferredTemplate : public ChatTemplate {
 public:
  explicit DeferredTemplate(std::string why) : why_(std::move(why)) {}
  std::string name() const override { return "(none)"; }
  std::string jinja() const override { return ""; }

 protected:
  std::vector<ChatSegment> render_impl(const std::vector<ChatMessage>&, const ChatSpecials&, bool,
                                       const nlohmann::ordered_json&) const override {
    fail("{}", why_);
  }

 private:
  std::string why_;
};

}  // namespace

std::shared_ptr<const ChatTemplate> chat_template_or_deferred(const std::string& name,
                                                              const std::string& model_dir,
                                                              const std::string& key) {
  try {
    return chat_template_for(name, model_dir);
  } catch (const Error& e) {
    return std::make_shared<DeferredTemplate>(
        fmt::format("a chat prompt needs a template: {}: {}", key, e.what()));
  }
}

RewardScorer::RewardScorer(const std::string& key, const std::string& dir,
                           const std::string& chat_template, const std::string& policy_dir,
                           const std::string& dtype, Device device, int64_t batch)
    : key_(key), dir_(dir), batch_(batch) {
  if (dir.empty()) fail("{}: no model folder given", key);
  if (batch < 1) fail("align.score_batch_size: must be >= 1, got {}", batch);
  RunnableModel m;
  try {
    ModelSourceKeys k;
    k.prefix = "align";
    k.model = dir;
    k.dtype = dtype;
    k.device = device;
    m = load_runnable_model(k);
  } catch (const Error& e) {
    fail("{} '{}': {}", key, dir, e.what());
  }
  if (m.gguf) fail("{} '{}': a GGUF file; a reward model is a model folder", key, dir);
  model_ = std::move(m.model);
  tok_ = std::move(m.tokenizer);
  if (model_->config().num_labels < 1)
    fail(
        "{} '{}': a causal LM (num_labels 0), not a sequence classifier; "
        "train one with "
        "align.method=rm or import a *ForSequenceClassification model",
        key, dir);
  // The folder's own template, else the one the policy's data uses.
  try {
    tmpl_ = chat_template_for("auto", dir);
  } catch (const Error&) {
    tmpl_ = chat_template_or_deferred(chat_template, policy_dir, "data.chat_template");
  }
  specials_ = chat_specials(*tok_, dir);
}

RewardScorer::~RewardScorer() = default;

int64_t RewardScorer::num_labels() const {
  return model_->config().num_labels;
}

const std::vector<std::string>& RewardScorer::labels() const {
  return model_->config().labels;
}

std::vector<std::vector<float>> RewardScorer::score(
    const std::vector<std::vector<int32_t>>& seqs) const {
  try {
    return score_sequences(*model_, seqs, batch_);
  } catch (const Error& e) {
    throw e.with_context(fmt::format("{} '{}'", key_, dir_));
  }
}

}  // namespace nk
