#include "train/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "core/crc32c.h"
#include "core/error.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
constexpr const char* kPrefix = "events.out.tfevents.";

uint32_t masked_crc(const void* p, size_t n) {
  const uint32_t c = crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xFF));
}
uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}

// Protobuf wire format: varint, and a field key (number << 3 | wire type).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, uint64_t(field) << 3 | uint64_t(wire_type));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
void put_double(std::string& out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_key(out, field, 1);
  put_le(out, bits, 8);
}

// Event fields: wall_time = 1 (double), step = 2 (int64), file_version = 3
// (string), summary = 5 (Summary). Summary: value = 1 (repeated Value).
// Summary.Value: tag = 1 (string), simple_value = 2 (float).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_double(e, 1, wall_time);
  if (step != 0) {
    put_key(e, 2, 0);
    put_varint(e, uint64_t(step));
  }
  return e;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

bool is_event_file(const fs::path& p) {
  return p.filename().string().rfind(kPrefix, 0) == 0 && !is_temporary_name(p.filename().string());
}

// The step (field 2) of an Event message; 0 when absent.
int64_t step_of(const std::string& ev) {
  size_t i = 0;
  auto varint = [&](uint64_t& v) {
    v = 0;
    for (int shift = 0; i < ev.size() && shift < 64; shift += 7) {
      const uint8_t b = uint8_t(ev[i++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  while (i < ev.size()) {
    uint64_t key, v;
    if (!varint(key)) return 0;
    switch (key & 7) {
      case 0:
        if (!varint(v)) return 0;
        if ((key >> 3) == 2) return int64_t(v);
        break;
      case 1:
        i += 8;
        break;
      case 2:
        if (!varint(v)) return 0;
        i += v;
        break;
      case 5:
        i += 4;
        break;
      default:
        return 0;
    }
  }
  return 0;
}

std::string hostname() {
  char h[256] = {};
  if (::gethostname(h, sizeof h - 1) != 0 || !h[0]) return "localhost";
  return h;
}

}  // namespace

std::string encode_file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string encode_scalar_event(double wall_time, int64_t step,
                                const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, v] : scalars) {
    if (!std::isfinite(v)) continue;
    std::string value;
    put_bytes(value, 1, tag);
    const float f = float(v);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    put_key(value, 2, 5);
    put_le(value, bits, 4);
    put_bytes(summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string tfrecord(const std::string& data) {
  std::string r;
  put_le(r, data.size(), 8);
  put_le(r, masked_crc(r.data(), 8), 4);
  r += data;
  put_le(r, masked_crc(data.data(), data.size()), 4);
  return r;
}

std::vector<int64_t> event_file_steps(const std::string& path, size_t* valid_bytes) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string b = ss.str();
  std::vector<int64_t> steps;
  size_t at = 0;
  while (b.size() - at >= 12) {
    const char* p = b.data() + at;
    if (uint32_t(get_le(p + 8, 4)) != masked_crc(p, 8)) break;
    const uint64_t n = get_le(p, 8);
    if (n > b.size() - at - 16) break;
    if (uint32_t(get_le(p + 12 + n, 4)) != masked_crc(p + 12, n)) break;
    steps.push_back(step_of(std::string(p + 12, n)));
    at += 16 + n;
  }
  if (valid_bytes) *valid_bytes = at;
  return steps;
}

EventFileWriter::EventFileWriter(const std::string& dir, int64_t resume_step, bool owned) {
  std::vector<fs::path> old;
  std::error_code ec;
  // A folder the run does not own: its event files are other runs'.
  for (const auto& e : fs::directory_iterator(dir.empty() ? "." : dir, ec))
    if (owned && e.is_regular_file() && is_event_file(e.path())) old.push_back(e.path());
  std::sort(old.begin(), old.end());
  if (resume_step > 0 && !old.empty()) {
    // Names carry the start time: the newest is this run's.
    path_ = old.back().string();
    std::ifstream in(path_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string bytes = ss.str();
    size_t valid = 0, keep = 0;
    const std::vector<int64_t> steps = event_file_steps(path_, &valid);
    for (size_t i = 0, at = 0; i < steps.size(); ++i) {
      const size_t len = 16 + size_t(get_le(bytes.data() + at, 8));
      if (steps[i] > resume_step) break;
      at += len;
      keep = at;
    }
    if (keep != bytes.size()) write_file_atomic(path_, bytes.substr(0, keep));
    f_ = std::fopen(path_.c_str(), "ab");
    if (!f_) fail("cannot append to TensorBoard event file '{}'", path_);
    if (keep == 0) write_record(encode_file_version_event(now_seconds()));
    return;
  }
  for (const fs::path& p : old) fs::remove(p, ec);
  const double t = now_seconds();
  path_ = (fs::path(dir) / fmt::format("{}{}.{}", kPrefix, int64_t(t), hostname())).string();
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) fail("cannot write TensorBoard event file '{}'", path_);
  write_record(encode_file_version_event(t));
}

EventFileWriter::~EventFileWriter() {
  if (f_) std::fclose(f_);
}

void EventFileWriter::write_record(const std::string& event) {
  const std::string r = tfrecord(event);
  if (std::fwrite(r.data(), 1, r.size(), f_) != r.size() || std::fflush(f_) != 0)
    fail("cannot write TensorBoard event file '{}'", path_);
}

void EventFileWriter::add_scalars(int64_t step,
                                  const std::vector<std::pair<std::string, double>>& scalars) {
  write_record(encode_scalar_event(now_seconds(), step, scalars));
}

}  // namespace nk
