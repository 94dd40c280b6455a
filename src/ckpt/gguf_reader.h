// Reading GGUF files (v2 and v3; the layout is in ckpt/gguf_writer.h): the
// typed metadata and the tensor table, checked against the file's size, with
// the tensor data mapped read-only (mmap), so a multi-GiB model is not read
// into memory twice. Every malformed or truncated part is an nk::Error naming
// the file, the byte offset and the key or tensor being read.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "ckpt/gguf_writer.h"
#include "core/tensor.h"

namespace nk {

class GgufFile {
 public:
  // A metadata value: integers of every width as int64 (u64 above INT64_MAX
  // is refused), f32 and f64 as double, bool, string, and arrays of those.
  using Scalar = std::variant<int64_t, double, bool, std::string>;
  using Value = std::variant<Scalar, std::vector<Scalar>>;

  struct TensorInfo {
    std::string name;
    Shape shape;                    // row-major, outermost first (ne reversed)
    uint32_t type = 0;              // ggml's type number; GgmlType when it is one Nekton knows
    bool known = false;             // type is a GgmlType (its bytes were checked against the file)
    const uint8_t* data = nullptr;  // into the mapping
    size_t bytes = 0;
  };

  // Opens and checks PATH. nk::Error naming the file for a missing file, a
  // bad magic or version, a truncated or oversized part, a duplicate key or
  // tensor, or tensor data outside the file.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }

  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  // Typed getters: nk::Error naming the file and key when it is missing or of
  // another type (an integer where a float is asked is accepted).
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_strings(const std::string& key) const;
  std::vector<double> get_floats(const std::string& key) const;
  std::vector<int64_t> get_ints(const std::string& key) const;
  // With a default when the key is absent (wrong types are still errors).
  std::string get_string(const std::string& key, const std::string& def) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_float(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;

  // Every metadata pair as stored: key, value type and the value's bytes (for
  // copying a file's metadata into another: GgufWriter::add_raw).
  struct RawKv {
    std::string key;
    uint32_t type;
    std::string bytes;
  };
  const std::vector<RawKv>& raw_metadata() const { return raw_kv_; }

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  // nk::Error naming the file and tensor when absent.
  const TensorInfo& tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  const Value& value(const std::string& key) const;
  const Scalar& scalar(const std::string& key, const char* want) const;

  std::string path_;
  uint32_t version_ = 0;
  std::map<std::string, Value> kv_;
  std::vector<RawKv> raw_kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// Rows [row0, row0 + rows) of a 2-d tensor of a known type (or the values
// of a 1-d one, row0 = 0, rows = 1), read into f32 (dst: rows x shape.back()).
void gguf_decode_rows(const GgufFile::TensorInfo& t, int64_t row0, int64_t rows, float* dst);

// The name of a ggml type number ("q5_k", "iq2_xs", ...), "type N" for an
// unknown one.
std::string ggml_type_number_name(uint32_t type);

}  // namespace nk
