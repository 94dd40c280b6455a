#include "train/metrics.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace nk {

MetricsWriter::MetricsWriter(const std::string& path, bool append) {
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_) fail("cannot write metrics file '{}'", path);
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const std::vector<std::pair<std::string, double>>& fields,
                          const std::vector<std::pair<std::string, std::vector<double>>>& arrays) {
  auto num = [](double v) { return std::isfinite(v) ? fmt::format("{}", v) : std::string("null"); };
  std::string line = "{";
  for (size_t i = 0; i < fields.size(); ++i)
    line += fmt::format("{}\"{}\": {}", i ? ", " : "", fields[i].first, num(fields[i].second));
  for (size_t i = 0; i < arrays.size(); ++i) {
    line += fmt::format("{}\"{}\": [", fields.empty() && i == 0 ? "" : ", ", arrays[i].first);
    for (size_t j = 0; j < arrays[i].second.size(); ++j)
      line += (j ? ", " : "") + num(arrays[i].second[j]);
    line += "]";
  }
  line += "}\n";
  std::fputs(line.c_str(), f_);
  std::fflush(f_);
}

void keep_metrics_through_step(const std::string& path, int64_t step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  std::string line, kept;
  bool dropped = false;
  while (std::getline(in, line)) {
    bool keep = false;
    if (!in.eof()) {  // a last line without its newline is a torn write
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      keep = j.is_object() && j.contains("step") && j["step"].is_number() &&
             j["step"].get<double>() <= double(step);
    }
    if (keep)
      kept += line + "\n";
    else
      dropped = true;
  }
  if (dropped) write_file_atomic(path, kept);
}

size_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return size_t(u.ru_maxrss) * 1024;
}

}  // namespace nk
