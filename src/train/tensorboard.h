// TensorBoard event files: the scalars of metrics.jsonl in the file format
// TensorBoard reads (`tensorboard --logdir OUT_DIR`).
//
// A file is a sequence of TFRecords:
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes |
//   `length` bytes of an Event protobuf | uint32 masked CRC-32C of them
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. The first Event is
// {wall_time, file_version: "brain.Event:2"}; each later one holds a step's
// scalars: {wall_time, step, summary {value {tag, simple_value}...}}.
// The few protobuf fields are written here by hand (field numbers of
// TensorFlow's event.proto and summary.proto); tests/train decode them with
// Python's protobuf.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace nk {

class EventFileWriter {
 public:
  // In `dir`, when the run owns it (`owned`: its OUT_DIR): for a fresh run
  // (resume_step == 0) removes the event files a previous run left there (as
  // metrics.jsonl is rewritten) and starts events.out.tfevents.<unix
  // time>.<host>; for a resumed one appends to the newest existing file after
  // dropping its records past `resume_step` and a torn or corrupt tail
  // (atomic rewrite), so the step axis continues once. In a folder it does not
  // own (train.metrics_file elsewhere, perhaps shared) it touches no existing
  // file and always starts a new one. nk::Error naming the file when it cannot
  // be written.
  EventFileWriter(const std::string& dir, int64_t resume_step, bool owned = true);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One Event with every finite value as a scalar named as given; flushed.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::string path_;
  FILE* f_ = nullptr;
};

// The encodings, for tests: an Event protobuf, and one TFRecord around it.
std::string encode_scalar_event(double wall_time, int64_t step,
                                const std::vector<std::pair<std::string, double>>& scalars);
std::string encode_file_version_event(double wall_time);
std::string tfrecord(const std::string& data);

// The step of each whole, checksum-valid record from the start of an event
// file (0 for the file_version one); reading stops at the first torn or
// corrupt record. `valid_bytes` (optional): where that is.
std::vector<int64_t> event_file_steps(const std::string& path, size_t* valid_bytes = nullptr);

}  // namespace nk
