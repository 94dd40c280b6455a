#include "train/train_data.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "data/chat/chat_config.h"
#include "data/chat/sft_data.h"
#include "data/dataset/blended_dataset.h"
#include "data/dataset/gpt_dataset.h"
#include "data/dataset/text_dataset.h"
#include "data/tokenizer/tokenizer.h"

namespace nk {

namespace {

TrainData text_data(const TrainConfig& cfg) {
  TextCorpus corpus = TextCorpus::load(cfg.data.path, cfg.data.val_fraction, cfg.data.max_bytes,
                                       cfg.data.replace_invalid_utf8);
  if (corpus.replaced)
    NK_WARN("{}: replaced {} invalid UTF-8 bytes with U+FFFD", cfg.data.path, corpus.replaced);
  if (int64_t(corpus.train.size()) < cfg.seq_len + 1)
    fail("data.path: '{}' has {} training tokens, fewer than train.seq_len + 1 = {}", cfg.data.path,
         corpus.train.size(), cfg.seq_len + 1);
  TrainData d;
  d.summary = fmt::format("{}: {} train / {} val tokens", cfg.data.path, corpus.train.size(),
                          corpus.val.size());
  auto train = std::make_shared<const std::vector<int32_t>>(std::move(corpus.train));
  auto val = std::make_shared<const std::vector<int32_t>>(std::move(corpus.val));
  d.train = std::make_shared<TextWindowDataset>(train, cfg.seq_len, cfg.seed,
                                                fmt::format("'{}' (train)", cfg.data.path));
  if (int64_t(val->size()) >= cfg.seq_len + 1)
    d.valid = std::make_shared<TextWindowDataset>(val, cfg.seq_len, cfg.seed + 1,
                                                  fmt::format("'{}' (val)", cfg.data.path));
  return d;
}

std::string cache_dir_for(const TrainConfig& cfg, const std::string& prefix) {
  if (!cfg.data.cache_dir.empty()) return cfg.data.cache_dir;
  namespace fs = std::filesystem;
  return (fs::weakly_canonical(fs::absolute(prefix)).parent_path() / "cache").string();
}

// The `which` split of every dataset in `prefixes`, blended by `weights` when
// there is more than one (or when the config asked for a blend).
std::shared_ptr<const SampleDataset> split_data(
    const TrainConfig& cfg, const std::vector<std::shared_ptr<const IndexedDataset>>& sets,
    const std::vector<double>& weights, DataSplit which, int64_t num_samples, bool blend) {
  GPTDatasetConfig g;
  g.split = cfg.data.split;
  g.which = which;
  g.seq_len = cfg.seq_len;
  g.seed = cfg.seed;
  g.cache_dir = cfg.data.cache_dir;
  const char* key = blend ? "data.blend" : "data.prefix";
  if (!blend) {
    g.num_samples = num_samples;
    try {
      return std::make_shared<GPTDataset>(sets[0], g);
    } catch (const Error& e) {
      throw e.with_context(key);
    }
  }
  std::vector<std::shared_ptr<const SampleDataset>> members;
  std::vector<std::string> ids;
  for (size_t i = 0; i < sets.size(); ++i) {
    // A zero weight draws nothing, but its dataset is still built and checked.
    g.num_samples = std::max<int64_t>(1, blend_member_samples(weights[i], num_samples));
    try {
      auto ds = std::make_shared<GPTDataset>(sets[i], g);
      ids.push_back("GPTDataset-" + ds->cache().hash_hex());
      members.push_back(std::move(ds));
    } catch (const Error& e) {
      throw e.with_context(key);
    }
  }
  try {
    return std::make_shared<BlendedDataset>(
        members, weights, num_samples, cache_dir_for(cfg, sets[0]->prefix()),
        std::string("BlendedDataset-") + split_name(which), ids);
  } catch (const Error& e) {
    throw e.with_context(key);
  }
}

TrainData indexed_data(const TrainConfig& cfg) {
  bool blend = !cfg.data.blend.empty();
  std::vector<std::string> prefixes =
      blend ? cfg.data.blend_sets.prefixes : std::vector{cfg.data.prefix};
  std::vector<double> weights = blend ? cfg.data.blend_sets.weights : std::vector{1.0};
  std::vector<std::shared_ptr<const IndexedDataset>> sets;
  const char* key = blend ? "data.blend" : "data.prefix";
  for (const std::string& p : prefixes) {
    try {
      sets.push_back(IndexedDataset::open(p));
    } catch (const Error& e) {
      throw e.with_context(key);
    }
  }
  TrainData d;
  d.train = split_data(cfg, sets, weights, DataSplit::Train, cfg.steps * cfg.global_batch, blend);
  if (cfg.val_every > 0) {
    try {
      d.valid = split_data(cfg, sets, weights, DataSplit::Valid, cfg.val_batches * cfg.micro_batch,
                           blend);
    } catch (const Error& e) {
      NK_WARN("no validation: {}", e.what());
    }
  }
  int64_t tokens = 0;
  for (const auto& s : sets) tokens += s->num_tokens();
  d.summary = fmt::format("{} ({} dataset{}, {} tokens, split {}): {} train samples{}",
                          blend ? cfg.data.blend : cfg.data.prefix, sets.size(),
                          sets.size() == 1 ? "" : "s", tokens, cfg.data.split, d.train->size(),
                          d.valid ? fmt::format(", {} valid samples", d.valid->size()) : "");
  return d;
}

}  // namespace

SftInputs sft_inputs(const TrainConfig& cfg) {
  const DataConfig& dc = cfg.data;
  SftInputs in;
  try {
    in.tok = load_tokenizer(dc.tokenizer);
  } catch (const Error& e) {
    throw e.with_context("data.tokenizer");
  }
  try {
    in.tmpl = chat_template_for(dc.chat_template, cfg.init_from);
  } catch (const Error& e) {
    throw e.with_context("data.chat_template");
  }
  in.specials = chat_specials(*in.tok, cfg.init_from);
  SftOptions& o = in.opt;
  o.messages_key = dc.messages_key;
  o.input_key = dc.input_key;
  o.output_key = dc.output_key;
  o.system_key = dc.system_key;
  o.loss_on = dc.loss_on == "all" ? LossOn::All : LossOn::Assistant;
  o.overlong = dc.overlong == "drop" ? OverlongSample::Drop : OverlongSample::Truncate;
  // p-tuning's virtual tokens take the first positions of each row.
  o.max_tokens = cfg.seq_len - cfg.model.prompt.virtual_tokens;
  return in;
}

namespace {

// Fine-tuning conversations: rows of train.seq_len tokens (packed or one
// sample each), the loss on what data.loss_on names.
TrainData sft_data(const TrainConfig& cfg) {
  const DataConfig& dc = cfg.data;
  const SftInputs in = sft_inputs(cfg);
  const Tokenizer* tok = in.tok.get();
  const int32_t pad = std::max(0, tok->eod_id());
  auto rows_of = [&](const std::string& path, const char* key, std::string& line) {
    SftData d;
    try {
      d = read_sft_jsonl(path, *in.tmpl, in.specials, *tok, in.opt);
    } catch (const Error& e) {
      throw e.with_context(key);
    }
    // p-tuning: placeholders for the virtual tokens before each sample (the
    // model replaces their embeddings; nothing predicts them).
    const size_t n = size_t(cfg.model.prompt.virtual_tokens);
    for (size_t i = 0; i < d.tokens.size() && n > 0; ++i) {
      d.tokens[i].insert(d.tokens[i].begin(), n, pad);
      d.trained[i].insert(d.trained[i].begin(), n, uint8_t(0));
    }
    PackedRows rows = sft_rows(d, cfg.seq_len, dc.pack, pad);
    line = fmt::format(
        "{}: {} samples ({} truncated, {} dropped), {} tokens of which {} trained, {} rows of {}{}",
        path, d.stats.records, d.stats.truncated, d.stats.dropped, d.stats.tokens,
        d.stats.trained_tokens, rows.n_rows, cfg.seq_len,
        dc.pack ? fmt::format(" packed ({:.0f}% full)", 100 * rows.efficiency()) : "");
    if (d.stats.dropped > 0 || d.stats.truncated > 0)
      NK_WARN(
          "{}: samples longer than train.seq_len = {}: {} truncated, {} dropped (data.overlong)",
          path, cfg.seq_len, d.stats.truncated, d.stats.dropped);
    return rows;
  };
  TrainData d;
  std::string train_line, valid_line;
  d.train =
      std::make_shared<SftDataset>(rows_of(dc.sft_path, "data.sft_path", train_line), cfg.seed,
                                   dc.shuffle, fmt::format("'{}' (train)", dc.sft_path));
  if (!dc.sft_valid_path.empty())
    d.valid = std::make_shared<SftDataset>(
        rows_of(dc.sft_valid_path, "data.sft_valid_path", valid_line), cfg.seed, false,
        fmt::format("'{}' (valid)", dc.sft_valid_path));
  d.summary = fmt::format("chat template {}; {}{}", in.tmpl->name(), train_line,
                          valid_line.empty() ? "" : "; valid " + valid_line);
  return d;
}

}  // namespace

TrainData build_train_data(const TrainConfig& cfg) {
  if (cfg.data.sft()) return sft_data(cfg);
  return cfg.indexed_data() ? indexed_data(cfg) : text_data(cfg);
}

}  // namespace nk
