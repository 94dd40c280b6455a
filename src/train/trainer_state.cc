#include "train/trainer_state.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"

namespace nk {

std::map<std::string, std::string> data_signature(const TrainConfig& cfg) {
  std::map<std::string, std::string> m;
  if (!cfg.data_path.empty()) {
    m["data.path"] = cfg.data_path;
    m["data.val_fraction"] = fmt::format("{}", cfg.val_fraction);
    m["data.max_bytes"] = std::to_string(cfg.max_bytes);
  } else {
    m["data.prefix"] = cfg.data_prefix;
    m["data.blend"] = cfg.data_blend;
    m["data.split"] = cfg.data_split;
  }
  m["train.seq_len"] = std::to_string(cfg.seq_len);
  m["train.seed"] = std::to_string(cfg.seed);
  m["train.global_batch"] = std::to_string(cfg.global_batch);
  m["num_samples"] = std::to_string(cfg.steps * cfg.global_batch);
  return m;
}

std::string trainer_state_path(const std::string& model_dir) {
  return (std::filesystem::path(model_dir) / "trainer_state.json").string();
}

void save_trainer_state(const std::string& path, const TrainerState& s) {
  nlohmann::json j;
  j["format"] = "nekton-trainer-state";
  j["version"] = 1;
  j["step"] = s.step;
  j["consumed_samples"] = s.consumed_samples;
  j["data"] = s.data;
  write_file_atomic(path, j.dump(2) + "\n");
}

TrainerState load_trainer_state(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("trainer state '{}' not found or unreadable", path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("trainer state '{}': not valid JSON: {}", path, e.what());
  }
  TrainerState s;
  try {
    if (j.value("format", "") != "nekton-trainer-state")
      fail("trainer state '{}': not a Nekton trainer state", path);
    if (j.at("version").get<int>() != 1)
      fail("trainer state '{}': unknown version {}", path, j.at("version").dump());
    s.step = j.at("step").get<int64_t>();
    s.consumed_samples = j.at("consumed_samples").get<int64_t>();
    s.data = j.at("data").get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    fail("trainer state '{}': missing or invalid field: {}", path, e.what());
  }
  if (s.step < 0 || s.consumed_samples < 0)
    fail("trainer state '{}': negative step or consumed_samples", path);
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
