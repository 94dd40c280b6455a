#include "apps/metrics_series.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace nk {

namespace fs = std::filesystem;

RunMetrics read_run_metrics(const std::string& run) {
  RunMetrics r;
  const fs::path p(run);
  if (!fs::exists(p))
    fail("'{}' not found: give a run's output folder (train.out_dir) or its metrics.jsonl", run);
  const bool folder = fs::is_directory(p);
  r.file = folder ? (p / "metrics.jsonl").string() : run;
  fs::path abs = fs::absolute(p).lexically_normal();
  if (!abs.has_filename()) abs = abs.parent_path();  // "runs/a/"
  r.name = (folder ? abs : abs.parent_path()).filename().string();
  if (!fs::exists(r.file))
    fail("'{}' not found: {} is not a training run's output folder (train.out_dir)", r.file, run);
  std::ifstream in(r.file, std::ios::binary);
  if (!in) fail("cannot read '{}'", r.file);
  std::string line;
  int64_t line_no = 0, records = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const bool torn = in.eof();  // no newline after it: still being written
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (torn && (j.is_discarded() || !j.is_object())) break;
    if (j.is_discarded() || !j.is_object())
      fail("{}:{}: not a JSON object: '{}'", r.file, line_no, line.substr(0, 80));
    if (!j.contains("step") || !j["step"].is_number())
      fail("{}:{}: no numeric \"step\" in the record", r.file, line_no);
    const double step = j["step"].get<double>();
    for (const auto& [key, v] : j.items()) {
      if (key == "step" || !v.is_number()) continue;  // arrays (moe_tokens.*) are not curves
      const double x = v.get<double>();
      if (std::isfinite(x)) r.series[key].emplace_back(step, x);
    }
    ++records;
  }
  if (records == 0) fail("'{}' is empty: the run has logged no step yet", r.file);
  return r;
}

}  // namespace nk
