#include "align/reference.h"

#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ckpt/model_io.h"
#include "core/atomic_file.h"
#include "core/json.h"
#include "data/dataset/text_dataset.h"
#include "train/train_checkpoint.h"

namespace nk {

void sequence_nll(Transformer& model, Activations& a, const Tensor& tokens, const Tensor& targets,
                  std::span<double> nll) {
  model.embed_forward(a, tokens);
  model.blocks_forward(a, 0, model.config().n_layer);
  model.head_row_nll(a, targets, nll);
}

void sequence_logps(Transformer& model, Activations& a, const Tensor& tokens, const Tensor& targets,
                    std::span<double> logp) {
  sequence_nll(model, a, tokens, targets, logp);
  for (double& v : logp) v = -v;
}

std::unique_ptr<Transformer> initial_model(const TrainConfig& cfg, bool frozen_copy) {
  TrainConfig c = cfg;
  if (frozen_copy) {
    c.frozen.clear();
    const ParamLayout layout = Transformer::layout_for(cfg.model);
    for (const ParamInfo& p : layout.params()) c.frozen.push_back(p.name);
    if (c.frozen_weights == FrozenWeights::Master && cfg.dtype == DType::BF16)
      c.frozen_weights = FrozenWeights::Compute;
  }
  if (!c.init_from.empty()) return load_run_model(c, c.init_from, "train.init_from");
  return std::make_unique<Transformer>(c.model, c.dtype, c.seed, ParamInit::Random, c.frozen,
                                       c.device, c.frozen_weights);
}

std::vector<double> compute_sequence_logps(Transformer& model, const PreferenceDataset& data,
                                           int64_t micro_batch) {
  Activations a(model, micro_batch, data.seq_len(), false);
  return compute_sequence_logps(
      data, micro_batch, model.device(),
      [&](const Tensor& tokens, const Tensor& targets, std::span<double> nll) {
        sequence_nll(model, a, tokens, targets, nll);
      });
}

std::vector<double> compute_sequence_logps(const PreferenceDataset& data, int64_t micro_batch,
                                           Device device, const RowNll& row_nll) {
  const int64_t S = int64_t(data.data().tokens.size()), B = micro_batch, T = data.seq_len();
  Tensor host_tokens = Tensor::empty({B, T}, DType::I32),
         host_targets = Tensor::empty({B, T}, DType::I32);
  Tensor tokens = ops::to_device(host_tokens, device),
         targets = ops::to_device(host_targets, device);
  std::vector<double> out(static_cast<size_t>(S)), nll(static_cast<size_t>(B));
  for (int64_t s0 = 0; s0 < S; s0 += B) {
    // A short last batch repeats its last sequence: every row is real data.
    for (int64_t b = 0; b < B; ++b)
      data.sequence_row(std::min(s0 + b, S - 1), host_tokens.data<int32_t>() + b * T,
                        host_targets.data<int32_t>() + b * T);
    ops::upload(tokens, host_tokens);
    ops::upload(targets, host_targets);
    row_nll(tokens, targets, nll);
    for (int64_t b = 0; b < B && s0 + b < S; ++b) out[size_t(s0 + b)] = -nll[size_t(b)];
  }
  return out;
}

namespace {

void hash_data(XXH3_state_t* h, const PreferenceData& d) {
  for (size_t s = 0; s < d.tokens.size(); ++s) {
    const uint64_t n = d.tokens[s].size();
    XXH3_64bits_update(h, &n, sizeof n);
    XXH3_64bits_update(h, d.tokens[s].data(), n * sizeof(int32_t));
    XXH3_64bits_update(h, d.trained[s].data(), n);
  }
}

void hash_text(XXH3_state_t* h, const std::string& s) {
  const uint64_t n = s.size();
  XXH3_64bits_update(h, &n, sizeof n);
  XXH3_64bits_update(h, s.data(), s.size());
}

}  // namespace

std::string reference_key(const TrainConfig& cfg, const PreferenceData& train,
                          const PreferenceData* valid) {
  namespace fs = std::filesystem;
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  hash_data(h, train);
  hash_text(h, valid ? "valid" : "no valid");
  if (valid) hash_data(h, *valid);
  hash_text(h, fmt::format("dtype {}, device {}, seq_len {}, micro_batch {}", dtype_name(cfg.dtype),
                           device_name(cfg.device), cfg.seq_len, cfg.micro_batch));
  if (cfg.init_from.empty()) {
    hash_text(h, fmt::format("seed {}", cfg.seed));
    hash_text(h, model_config_to_json(cfg.model));
  } else {
    // The source folder's config and weight files by name, size and time:
    // reading gigabytes again to hash them would cost what the pass saves.
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(cfg.init_from))
      if (e.is_regular_file()) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    hash_text(h, fs::absolute(cfg.init_from).lexically_normal().string());
    for (const std::string& n : names) {
      const fs::path p = fs::path(cfg.init_from) / n;
      if (n == "config.json") hash_text(h, read_text_file(p.string()));
      if (n != "config.json" && p.extension() != ".safetensors" && p.extension() != ".json")
        continue;
      hash_text(h, fmt::format("{} {} {}", n, fs::file_size(p),
                               fs::last_write_time(p).time_since_epoch().count()));
    }
  }
  const uint64_t key = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return fmt::format("{:016x}", key);
}

std::string reference_logps_path(const TrainConfig& cfg) {
  return cfg.out_dir + "/reference_logps.json";
}

void save_reference_logps(const std::string& path, const ReferenceLogps& r) {
  nlohmann::json j;
  j["format"] = "nekton-reference-logps";
  j["version"] = 1;
  j["key"] = r.key;
  j["train"] = r.train;  // doubles print with round-trip precision
  j["valid"] = r.valid;
  write_file_atomic(path, j.dump() + "\n");
}

std::optional<ReferenceLogps> load_reference_logps(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  const std::string where = "reference log-probabilities '" + path + "'";
  const nlohmann::json j = parse_json(read_text_file(path), where);
  ReferenceLogps r;
  try {
    if (!j.is_object() || j.value("format", "") != "nekton-reference-logps")
      fail("{}: not a Nekton reference file", where);
    r.key = j.at("key").get<std::string>();
    r.train = j.at("train").get<std::vector<double>>();
    r.valid = j.at("valid").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: missing or invalid field: {}", where, e.what());
  }
  return r;
}

}  // namespace nk
