// Metrics in Prometheus' text exposition format, version 0.0.4:
//
//   # HELP NAME one line of help
//   # TYPE NAME counter|gauge|histogram
//   NAME{label="value",...} VALUE
//
// A histogram writes its cumulative buckets NAME_bucket{le="BOUND"} (the last
// le="+Inf"), then NAME_sum and NAME_count. Counter names end in _total (as
// the format's conventions ask). Every family is safe to update from any
// thread; render() reads a consistent value per family.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nk {

// Label (name, value) pairs in the order they are written.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A value as Prometheus reads it: integers without a fraction ("3"), others
// in the shortest form that reads back exactly, "+Inf", "-Inf", "NaN".
std::string metric_value_text(double v);
// A label value with \ " and newline escaped as \\ \" \n.
std::string escape_label_value(std::string_view v);

class MetricFamily {
 public:
  MetricFamily(std::string name, std::string help, const char* type);
  virtual ~MetricFamily() = default;
  const std::string& name() const { return name_; }
  // Appends the HELP and TYPE lines and the samples.
  void render(std::string& out) const;

 protected:
  virtual void render_samples(std::string& out) const = 0;
  std::string name_, help_;
  const char* type_;
  mutable std::mutex mu_;
};

// Counters and gauges: one value per label set. A family without labels
// starts with its one value at 0; a labelled one shows the label sets seen.
class LabeledValues : public MetricFamily {
 public:
  LabeledValues(std::string name, std::string help, const char* type,
                std::vector<std::string> label_names);
  double value(const MetricLabels& labels = {}) const;

 protected:
  void change(const MetricLabels& labels, double v, bool add);
  void render_samples(std::string& out) const override;

 private:
  std::vector<std::string> label_names_;
  std::vector<std::pair<MetricLabels, double>> values_;  // in order of first use
};

class Counter : public LabeledValues {
 public:
  // name must end in "_total".
  Counter(std::string name, std::string help, std::vector<std::string> label_names = {});
  void inc(double by = 1, const MetricLabels& labels = {});  // by >= 0
};

class Gauge : public LabeledValues {
 public:
  Gauge(std::string name, std::string help, std::vector<std::string> label_names = {});
  void set(double v, const MetricLabels& labels = {});
};

class Histogram : public MetricFamily {
 public:
  // bounds: the buckets' upper bounds, increasing (+Inf is added).
  Histogram(std::string name, std::string help, std::vector<double> bounds);
  void observe(double v);
  int64_t count() const;
  double sum() const;

 protected:
  void render_samples(std::string& out) const override;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; the last is (bounds.back(), +Inf)
  double sum_ = 0;
  int64_t count_ = 0;
};

// The families of one process, written in the order they were added.
class MetricsRegistry {
 public:
  template <class F, class... Args>
  F& add(Args&&... args) {
    auto f = std::make_unique<F>(std::forward<Args>(args)...);
    F& ref = *f;
    families_.push_back(std::move(f));
    return ref;
  }
  std::string render() const;

 private:
  std::vector<std::unique_ptr<MetricFamily>> families_;
};

}  // namespace nk
