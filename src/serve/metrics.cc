#include "serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace nk {

std::string metric_value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::trunc(v) && std::fabs(v) < 1e15) return fmt::format("{}", int64_t(v));
  return fmt::format("{}", v);
}

std::string escape_label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

namespace {

std::string label_text(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::string s = "{";
  for (size_t i = 0; i < labels.size(); ++i)
    s += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first,
                     escape_label_value(labels[i].second));
  return s + "}";
}

}  // namespace

MetricFamily::MetricFamily(std::string name, std::string help, const char* type)
    : name_(std::move(name)), help_(std::move(help)), type_(type) {}

void MetricFamily::render(std::string& out) const {
  // HELP text escapes only \ and newline.
  std::string help;
  for (char c : help_) help += c == '\\' ? "\\\\" : c == '\n' ? "\\n" : std::string(1, c);
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name_, help, name_, type_);
  std::lock_guard lock(mu_);
  render_samples(out);
}

LabeledValues::LabeledValues(std::string name, std::string help, const char* type,
                             std::vector<std::string> label_names)
    : MetricFamily(std::move(name), std::move(help), type), label_names_(std::move(label_names)) {
  if (label_names_.empty()) values_.emplace_back(MetricLabels{}, 0.0);
}

double LabeledValues::value(const MetricLabels& labels) const {
  std::lock_guard lock(mu_);
  for (const auto& [l, v] : values_)
    if (l == labels) return v;
  return 0;
}

void LabeledValues::change(const MetricLabels& labels, double v, bool add) {
  NK_CHECK(labels.size() == label_names_.size(), "metric {}: {} labels, want {}", name_,
           labels.size(), label_names_.size());
  for (size_t i = 0; i < labels.size(); ++i)
    NK_CHECK(labels[i].first == label_names_[i], "metric {}: label {} is not {}", name_,
             labels[i].first, label_names_[i]);
  std::lock_guard lock(mu_);
  for (auto& [l, x] : values_)
    if (l == labels) {
      x = add ? x + v : v;
      return;
    }
  values_.emplace_back(labels, v);
}

void LabeledValues::render_samples(std::string& out) const {
  for (const auto& [l, v] : values_)
    out += fmt::format("{}{} {}\n", name_, label_text(l), metric_value_text(v));
}

Counter::Counter(std::string name, std::string help, std::vector<std::string> label_names)
    : LabeledValues(std::move(name), std::move(help), "counter", std::move(label_names)) {
  NK_CHECK(name_.ends_with("_total"), "counter {} must end in _total", name_);
}

void Counter::inc(double by, const MetricLabels& labels) {
  NK_CHECK(by >= 0, "counter {} decremented by {}", name_, by);
  change(labels, by, true);
}

Gauge::Gauge(std::string name, std::string help, std::vector<std::string> label_names)
    : LabeledValues(std::move(name), std::move(help), "gauge", std::move(label_names)) {}

void Gauge::set(double v, const MetricLabels& labels) {
  change(labels, v, false);
}

Histogram::Histogram(std::string name, std::string help, std::vector<double> bounds)
    : MetricFamily(std::move(name), std::move(help), "histogram"),
      bounds_(std::move(bounds)),
      counts_(bounds_.size() + 1, 0) {
  NK_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()) &&
               std::adjacent_find(bounds_.begin(), bounds_.end()) == bounds_.end(),
           "histogram {}: bounds must increase", name_);
}

void Histogram::observe(double v) {
  // Bucket le=B counts observations <= B.
  const size_t b = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  std::lock_guard lock(mu_);
  ++counts_[b];
  sum_ += v;
  ++count_;
}

int64_t Histogram::count() const {
  std::lock_guard lock(mu_);
  return count_;
}

double Histogram::sum() const {
  std::lock_guard lock(mu_);
  return sum_;
}

void Histogram::render_samples(std::string& out) const {
  int64_t cum = 0;
  for (size_t b = 0; b <= bounds_.size(); ++b) {
    cum += counts_[b];
    const double le = b < bounds_.size() ? bounds_[b] : INFINITY;
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name_, metric_value_text(le), cum);
  }
  out += fmt::format("{}_sum {}\n{}_count {}\n", name_, metric_value_text(sum_), name_, count_);
}

std::string MetricsRegistry::render() const {
  std::string out;
  for (const auto& f : families_) f->render(out);
  return out;
}

}  // namespace nk
