#include "ckpt/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/progress.h"
#include "ops/quant.h"

namespace nk {

namespace {

constexpr uint32_t kVersion = 3;

template <typename T>
void put(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(b, sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

uint64_t align_up(uint64_t n, uint64_t a) {
  return (n + a - 1) / a * a;
}

constexpr GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                               GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K};

}  // namespace

ops::QuantType ggml_quant_type(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0:
      return ops::QuantType::Q8_0;
    case GgmlType::Q4_0:
      return ops::QuantType::Q4_0;
    case GgmlType::Q4_K:
      return ops::QuantType::Q4_K;
    case GgmlType::Q6_K:
      return ops::QuantType::Q6_K;
    case GgmlType::F16:
      return ops::QuantType::F16;
    default:
      NK_CHECK(false, "{} has no ops::QuantType", uint32_t(t));
  }
}

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return "f32";
    case GgmlType::F16:
      return "f16";
    case GgmlType::BF16:
      return "bf16";
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q4_K:
    case GgmlType::Q6_K:
      return ops::quant_type_name(ggml_quant_type(t));
  }
  return "?";
}

GgmlType parse_ggml_type(const std::string& s) {
  for (GgmlType t : kTypes)
    if (s == ggml_type_name(t)) return t;
  fail("unknown GGUF tensor type '{}' (known: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k)", s);
}

bool ggml_is_quantized(GgmlType t) {
  return t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16;
}

int64_t ggml_block(GgmlType t) {
  return ggml_is_quantized(t) ? ops::quant_block(ggml_quant_type(t)) : 1;
}

size_t ggml_nbytes(GgmlType t, int64_t n) {
  switch (t) {
    case GgmlType::F32:
      return size_t(n) * 4;
    case GgmlType::F16:
    case GgmlType::BF16:
      return size_t(n) * 2;
    default:
      NK_CHECK(n % ggml_block(t) == 0, "{} needs a multiple of {} values, got {}",
               ggml_type_name(t), ggml_block(t), n);
      return ops::quant_row_bytes(ggml_quant_type(t), n);
  }
}

void ggml_encode(GgmlType t, const float* x, int64_t n, int64_t row, std::string& out) {
  NK_CHECK(row > 0 && n % row == 0, "ggml_encode: {} values in rows of {}", n, row);
  out.reserve(out.size() + ggml_nbytes(t, n));
  switch (t) {
    case GgmlType::F32:
      out.append(reinterpret_cast<const char*>(x), size_t(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) put<uint16_t>(out, f32_to_f16(x[i]).bits);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) put<uint16_t>(out, f32_to_bf16(x[i]).bits);
      return;
    default: {
      ops::QuantWeight q = ops::QuantWeight::empty(ggml_quant_type(t), {n / row, row});
      ops::quant_quantize(q, Tensor::from_blob(const_cast<float*>(x), {n / row, row}, DType::F32));
      out.append(static_cast<const char*>(q.data.raw()), q.data.nbytes());
    }
  }
}

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  NK_CHECK(alignment > 0 && alignment % 8 == 0, "GGUF alignment {} is not a multiple of 8",
           alignment);
}

void GgufWriter::begin_kv(const std::string& key, uint32_t value_type) {
  NK_CHECK(std::find(keys_.begin(), keys_.end(), key) == keys_.end(), "GGUF key '{}' given twice",
           key);
  keys_.push_back(key);
  put_string(kv_, key);
  put<uint32_t>(kv_, value_type);
}

void GgufWriter::add_raw(const std::string& key, uint32_t value_type, const std::string& bytes) {
  begin_kv(key, value_type);
  kv_ += bytes;
}

void GgufWriter::add_string(const std::string& key, const std::string& v) {
  begin_kv(key, kGgufString);
  put_string(kv_, v);
}

void GgufWriter::add_u32(const std::string& key, uint32_t v) {
  begin_kv(key, kGgufU32);
  put<uint32_t>(kv_, v);
}

void GgufWriter::add_i32(const std::string& key, int32_t v) {
  begin_kv(key, kGgufI32);
  put<int32_t>(kv_, v);
}

void GgufWriter::add_f32(const std::string& key, float v) {
  begin_kv(key, kGgufF32);
  put<float>(kv_, v);
}

void GgufWriter::add_bool(const std::string& key, bool v) {
  begin_kv(key, kGgufBool);
  put<uint8_t>(kv_, v ? 1 : 0);
}

void GgufWriter::add_strings(const std::string& key, const std::vector<std::string>& v) {
  begin_kv(key, kGgufArray);
  put<uint32_t>(kv_, kGgufString);
  put<uint64_t>(kv_, v.size());
  for (const std::string& s : v) put_string(kv_, s);
}

void GgufWriter::add_f32s(const std::string& key, const std::vector<float>& v) {
  begin_kv(key, kGgufArray);
  put<uint32_t>(kv_, kGgufF32);
  put<uint64_t>(kv_, v.size());
  for (float x : v) put<float>(kv_, x);
}

void GgufWriter::add_i32s(const std::string& key, const std::vector<int32_t>& v) {
  begin_kv(key, kGgufArray);
  put<uint32_t>(kv_, kGgufI32);
  put<uint64_t>(kv_, v.size());
  for (int32_t x : v) put<int32_t>(kv_, x);
}

void GgufWriter::add_tensor(const std::string& name, const Shape& shape, GgmlType type,
                            Producer produce) {
  NK_CHECK(!shape.empty() && shape.size() <= 4, "GGUF tensor '{}': {} dimensions", name,
           shape.size());
  for (const TensorEntry& t : tensors_)
    NK_CHECK(t.name != name, "GGUF tensor '{}' given twice", name);
  if (shape.back() % ggml_block(type) != 0)
    fail("tensor '{}' {}: {} needs rows whose length is a multiple of {}, this one has {}", name,
         shape_str(shape), ggml_type_name(type), ggml_block(type), shape.back());
  size_t bytes = ggml_nbytes(type, shape_numel(shape));
  tensors_.push_back({name, shape, type, std::move(produce), data_bytes_, bytes});
  data_bytes_ = align_up(data_bytes_ + bytes, alignment_);
}

void GgufWriter::write(const std::string& path, Progress* progress) const {
  std::string head;
  head += "GGUF";
  put<uint32_t>(head, kVersion);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, keys_.size());
  head += kv_;
  for (const TensorEntry& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, uint32_t(t.shape.size()));
    for (size_t i = t.shape.size(); i-- > 0;) put<uint64_t>(head, uint64_t(t.shape[i]));
    put<uint32_t>(head, uint32_t(t.type));
    put<uint64_t>(head, t.offset);
  }
  head.resize(align_up(head.size(), alignment_), '\0');

  AtomicFileWriter out(path);
  out.write(head.data(), head.size());
  std::vector<float> values;
  std::string bytes;
  uint64_t at = 0;  // bytes of the data section written so far
  if (progress) progress->start(double(data_bytes_), "B");
  for (const TensorEntry& t : tensors_) {
    values.clear();
    t.produce(values);
    if (int64_t(values.size()) != shape_numel(t.shape))
      fail("GGUF tensor '{}': {} values for shape {}", t.name, values.size(), shape_str(t.shape));
    bytes.assign(t.offset - at, '\0');  // padding after the previous tensor
    ggml_encode(t.type, values.data(), int64_t(values.size()), t.shape.back(), bytes);
    NK_CHECK(bytes.size() == t.offset - at + t.bytes, "tensor '{}' encoded to {} bytes", t.name,
             bytes.size());
    out.write(bytes.data(), bytes.size());
    if (progress) progress->advance(double(t.offset + t.bytes - at));
    at = t.offset + t.bytes;
  }
  std::string tail(data_bytes_ - at, '\0');
  out.write(tail.data(), tail.size());
  out.commit();
  if (progress) progress->finish();
}

}  // namespace nk
