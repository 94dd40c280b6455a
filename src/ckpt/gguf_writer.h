// Writing GGUF v3 files, the single-file model format of ggml/llama.cpp
// (the published spec: ggml's docs/gguf.md). Layout, all little-endian:
//   "GGUF" u32 version=3 u64 n_tensors u64 n_kv
//   n_kv x (string key, u32 value type, value)       typed metadata
//   n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset)
//   zero padding to general.alignment (32), then the tensor data, each tensor
//   starting at a multiple of the alignment (offsets are relative to the data).
// Strings are u64 length + bytes (no terminator); arrays are u32 element type,
// u64 count, elements. ne[0] is the innermost (contiguous) dimension, so a
// row-major [out, in] weight has ne = {in, out}.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/quant.h"

namespace nk {

class Progress;

// GGUF metadata value types (gguf_metadata_value_type in the spec).
enum GgufValueType : uint32_t {
  kGgufU8 = 0,
  kGgufI8 = 1,
  kGgufU16 = 2,
  kGgufI16 = 3,
  kGgufU32 = 4,
  kGgufI32 = 5,
  kGgufF32 = 6,
  kGgufBool = 7,
  kGgufString = 8,
  kGgufArray = 9,
  kGgufU64 = 10,
  kGgufI64 = 11,
  kGgufF64 = 12,
};

// ggml tensor types Nekton reads and writes (ggml's numbering). The block
// formats' layouts are in ops/quant.h.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q8_0 = 8,
  Q4_K = 12,
  Q6_K = 14,
  BF16 = 30
};

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k".
const char* ggml_type_name(GgmlType t);
// nk::Error listing the known names otherwise.
GgmlType parse_ggml_type(const std::string& s);
// Whether t is a block-quantised type (ops::QuantType of the same name).
bool ggml_is_quantized(GgmlType t);
// The ops::QuantType a matrix of type t is held in: a block format's own, or
// F16 (InternalError for F32 and BF16).
ops::QuantType ggml_quant_type(GgmlType t);

// Q8_0: blocks of 32 values, each an f16 scale d then 32 int8 q; x ~ q * d.
constexpr int64_t kQ8Block = 32;
constexpr int64_t kQ8BlockBytes = 2 + kQ8Block;

// Values per block: 1 for the float types, 32 or 256 for the block formats.
int64_t ggml_block(GgmlType t);
// Bytes of n values of type t (n a multiple of ggml_block(t)).
size_t ggml_nbytes(GgmlType t, int64_t n);
// Appends n values of x encoded as type t to out, as rows of `row` values
// (row divides n; the block formats need row % ggml_block(t) == 0). f16/bf16
// round to nearest even; the block formats quantise as ops::quant_quantize
// (Q8_0: d = max|x| / 127 rounded to f16, q = round(x / d) with the stored
// d, so |x - q d| <= d / 2 for every value).
void ggml_encode(GgmlType t, const float* x, int64_t n, int64_t row, std::string& out);

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32);

  // Metadata, in the order written. A key given twice is an InternalError.
  void add_string(const std::string& key, const std::string& v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_strings(const std::string& key, const std::vector<std::string>& v);
  void add_f32s(const std::string& key, const std::vector<float>& v);
  void add_i32s(const std::string& key, const std::vector<int32_t>& v);
  // A value already encoded (GgufFile::raw_metadata): copied as it is.
  void add_raw(const std::string& key, uint32_t value_type, const std::string& bytes);

  // Fills `out` (resized by the callee) with the tensor's values in row-major
  // order of its shape. Called once, while write() streams the data, so at most
  // one tensor's values are in memory at a time.
  using Producer = std::function<void(std::vector<float>& out)>;
  // `shape` outermost first (row-major, as Nekton's tensors); written
  // reversed as ne. nk::Error naming the tensor when type is a block format
  // and the innermost dimension is not a multiple of its block.
  void add_tensor(const std::string& name, const Shape& shape, GgmlType type, Producer produce);

  // Writes the file atomically (core/atomic_file.h): on any error PATH is left
  // as it was. nk::Error naming the tensor whose producer gives the wrong count.
  // `progress` (optional): the data section's bytes as each tensor is encoded.
  void write(const std::string& path, Progress* progress = nullptr) const;

  int64_t tensor_count() const { return int64_t(tensors_.size()); }

 private:
  struct TensorEntry {
    std::string name;
    Shape shape;
    GgmlType type;
    Producer produce;
    uint64_t offset;  // into the data section
    size_t bytes;
  };
  void begin_kv(const std::string& key, uint32_t value_type);

  uint32_t alignment_;
  std::string kv_;  // encoded metadata pairs
  std::vector<std::string> keys_;
  std::vector<TensorEntry> tensors_;
  uint64_t data_bytes_ = 0;  // aligned end of the last tensor
};

}  // namespace nk
