#include "train/trainer_state.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/log.h"

namespace nk {

std::map<std::string, std::string> data_signature(const TrainConfig& cfg) {
  std::map<std::string, std::string> m;
  if (!cfg.data.path.empty()) {
    m["data.path"] = cfg.data.path;
    m["data.val_fraction"] = fmt::format("{}", cfg.data.val_fraction);
    m["data.max_bytes"] = std::to_string(cfg.data.max_bytes);
  } else if (cfg.data.sft()) {
    const DataConfig& d = cfg.data;
    m["data.sft_path"] = d.sft_path;
    m["data.sft_rows"] = fmt::format("template {}, loss_on {}, pack {}, overlong {}, shuffle {}",
                                     d.chat_template, d.loss_on, d.pack, d.overlong, d.shuffle);
  } else {
    m["data.prefix"] = cfg.data.prefix;
    m["data.blend"] = cfg.data.blend;
    m["data.split"] = cfg.data.split;
  }
  m["train.seq_len"] = std::to_string(cfg.seq_len);
  m["train.seed"] = std::to_string(cfg.seed);
  m["train.global_batch"] = std::to_string(cfg.global_batch);
  m["num_samples"] = std::to_string(cfg.steps * cfg.global_batch);
  for (const auto& [key, value] : cfg.extra_data_signature) m[key] = value;
  return m;
}

std::string trainer_state_path(const std::string& model_dir) {
  return (std::filesystem::path(model_dir) / "trainer_state.json").string();
}

std::map<std::string, uint64_t> rng_streams(const TrainConfig& cfg, int64_t consumed_samples) {
  // Seeds as train_data.cc and the Transformer use them.
  return {{"init.seed", cfg.seed},
          {"data.train.seed", cfg.seed},
          {"data.train.position", uint64_t(consumed_samples)},
          {"data.valid.seed", cfg.seed + 1}};
}

std::string trainer_state_to_json(const TrainerState& s) {
  nlohmann::json j;
  j["format"] = "nekton-trainer-state";
  j["version"] = 2;
  j["step"] = s.step;
  j["consumed_samples"] = s.consumed_samples;
  j["optimizer_steps"] = s.optimizer_steps;
  j["lr_schedule"] = {{"lr", s.lr.lr},
                      {"min_lr", s.lr.min_lr},
                      {"warmup_steps", s.lr.warmup_steps},
                      {"decay_steps", s.lr.decay_steps},
                      {"next_step", s.step},
                      {"last_lr", s.last_lr}};
  j["rng"] = s.rng;
  j["data"] = s.data;
  return j.dump(2) + "\n";
}

void save_trainer_state(const std::string& path, const TrainerState& s) {
  write_file_atomic(path, trainer_state_to_json(s));
}

TrainerState load_trainer_state(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("trainer state '{}' not found or unreadable", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return trainer_state_from_json(ss.str(), path);
}

TrainerState trainer_state_from_json(const std::string& text, const std::string& path) {
  const std::string where = "trainer state '" + path + "'";
  nlohmann::json j = parse_json(text, where);
  TrainerState s;
  // Counts are integers >= 0: a float or a negative value is an error, not a cast.
  auto count = [&](const nlohmann::json& v, const char* key) {
    return json_int(v, where, key, 0, INT64_MAX);
  };
  try {
    if (!j.is_object() || j.value("format", "") != "nekton-trainer-state")
      fail("trainer state '{}': not a Nekton trainer state", path);
    int64_t version = count(j.at("version"), "version");
    if (version != 1 && version != 2)
      fail("trainer state '{}': unknown version {}", path, j.at("version").dump());
    s.step = count(j.at("step"), "step");
    s.consumed_samples = count(j.at("consumed_samples"), "consumed_samples");
    s.data = j.at("data").get<std::map<std::string, std::string>>();
    if (version >= 2) {
      s.optimizer_steps = count(j.at("optimizer_steps"), "optimizer_steps");
      const auto& l = j.at("lr_schedule");
      s.lr.lr = l.at("lr").get<double>();
      s.lr.min_lr = l.at("min_lr").get<double>();
      s.lr.warmup_steps = count(l.at("warmup_steps"), "lr_schedule.warmup_steps");
      s.lr.decay_steps = count(l.at("decay_steps"), "lr_schedule.decay_steps");
      s.last_lr = l.at("last_lr").get<double>();
      if (count(l.at("next_step"), "lr_schedule.next_step") != s.step)
        fail("trainer state '{}': lr_schedule.next_step {} is not step {}", path,
             l.at("next_step").dump(), s.step);
      s.rng = j.at("rng").get<std::map<std::string, uint64_t>>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail("trainer state '{}': missing or invalid field: {}", path, e.what());
  }
  return s;
}

void check_resume_data(const TrainerState& saved, const TrainConfig& cfg,
                       const std::string& where) {
  std::map<std::string, std::string> now = data_signature(cfg);
  for (const auto& [key, value] : saved.data) {
    auto it = now.find(key);
    std::string current = it == now.end() ? "(not set)" : it->second;
    if (current == value) continue;
    if (key == "num_samples") {
      NK_WARN(
          "{}: the saved run built its indices for {} samples, this one for {} (train.steps "
          "changed): the samples from here on differ from the saved run's plan",
          where, value, current);
      continue;
    }
    fail("{}: {} was '{}' in the saved run but is '{}' now; resuming would read other samples",
         where, key, value, current);
  }
  for (const auto& [key, value] : now)
    if (!saved.data.count(key))
      fail("{}: the saved run has no {} (now '{}'); it trained on other data", where, key, value);
}

}  // namespace nk
