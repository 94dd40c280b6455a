#include "ckpt/gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/quant.h"

namespace nk {

namespace {

// Bounds on what a sane file holds; past them the file is corrupt, and
// refusing early keeps a flipped length from allocating gigabytes.
constexpr uint64_t kMaxString = uint64_t(1) << 30;
constexpr uint64_t kMaxCount = uint64_t(1) << 28;
constexpr uint32_t kMaxDims = 4;
// The largest dimension and element count a tensor may claim (2^40, 2^42):
// beyond any real model, and small enough that sizes in bytes cannot overflow.
constexpr uint64_t kMaxDim = uint64_t(1) << 40;
constexpr int64_t kMaxElements = int64_t(1) << 42;

// A cursor over the mapped header; every read is bounds-checked.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  size_t pos() const { return pos_; }
  void need(uint64_t bytes, const std::string& what) {
    if (bytes > n_ - pos_)
      fail("GGUF '{}': truncated at byte {} reading {} ({} bytes needed, {} left)", path_, pos_,
           what, bytes, n_ - pos_);
  }
  template <typename T>
  T get(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const std::string& what) {
    const uint64_t len = get<uint64_t>(what);
    if (len > kMaxString)
      fail("GGUF '{}': {} at byte {} claims a string of {} bytes", path_, what, pos_ - 8, len);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(len));
    pos_ += size_t(len);
    return s;
  }
  [[noreturn]] void bad(const std::string& msg) {
    fail("GGUF '{}': {} (at byte {})", path_, msg, pos_);
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& path_;
};

GgufFile::Scalar read_scalar(Cursor& c, uint32_t type, const std::string& what) {
  switch (type) {
    case kGgufU8:
      return int64_t(c.get<uint8_t>(what));
    case kGgufI8:
      return int64_t(c.get<int8_t>(what));
    case kGgufU16:
      return int64_t(c.get<uint16_t>(what));
    case kGgufI16:
      return int64_t(c.get<int16_t>(what));
    case kGgufU32:
      return int64_t(c.get<uint32_t>(what));
    case kGgufI32:
      return int64_t(c.get<int32_t>(what));
    case kGgufU64: {
      const uint64_t v = c.get<uint64_t>(what);
      if (v > uint64_t(std::numeric_limits<int64_t>::max()))
        c.bad(fmt::format("{} is a u64 above 2^63 ({})", what, v));
      return int64_t(v);
    }
    case kGgufI64:
      return c.get<int64_t>(what);
    case kGgufF32:
      return double(c.get<float>(what));
    case kGgufF64:
      return c.get<double>(what);
    case kGgufBool: {
      const uint8_t b = c.get<uint8_t>(what);
      if (b > 1) c.bad(fmt::format("{} is a bool of value {}", what, b));
      return b == 1;
    }
    case kGgufString:
      return c.string(what);
    default:
      c.bad(fmt::format("{} has unknown value type {}", what, type));
  }
}

GgufFile::Value read_value(Cursor& c, uint32_t type, const std::string& what) {
  if (type != kGgufArray) return read_scalar(c, type, what);
  const uint32_t elem = c.get<uint32_t>(what + " (array type)");
  if (elem == kGgufArray)
    c.bad(fmt::format("{} is an array of arrays, which Nekton does not read", what));
  const uint64_t n = c.get<uint64_t>(what + " (array length)");
  if (n > kMaxCount) c.bad(fmt::format("{} claims {} elements", what, n));
  // No reserve(n): n comes from the file, and a short file claiming many
  // elements must fail when they run out, not allocate n up front (fuzz_gguf).
  std::vector<GgufFile::Scalar> v;
  for (uint64_t i = 0; i < n; ++i) v.push_back(read_scalar(c, elem, what));
  return v;
}

const char* kind_of(const GgufFile::Scalar& s) {
  switch (s.index()) {
    case 0:
      return "an integer";
    case 1:
      return "a float";
    case 2:
      return "a bool";
    default:
      return "a string";
  }
}

}  // namespace

void gguf_decode_rows(const GgufFile::TensorInfo& t, int64_t row0, int64_t rows, float* dst) {
  NK_CHECK(t.known, "gguf_decode_rows: tensor '{}' of an unknown type", t.name);
  const GgmlType type = GgmlType(t.type);
  const int64_t in = t.shape.back();
  const size_t row_bytes = ggml_nbytes(type, in);
  const uint8_t* src = t.data + size_t(row0) * row_bytes;
  const int64_t n = rows * in;
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case GgmlType::F16:
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = type == GgmlType::F16 ? f16_to_f32(f16{b}) : bf16_to_f32(bf16{b});
      }
      return;
    default: {
      ops::QuantWeight q;
      q.type = ggml_quant_type(type);
      q.shape = {rows, in};
      q.data = Tensor::from_blob(const_cast<uint8_t*>(src), {int64_t(row_bytes) * rows}, DType::U8);
      ops::quant_dequantize(Tensor::from_blob(dst, {rows, in}, DType::F32), q);
    }
  }
}

std::string ggml_type_number_name(uint32_t type) {
  static const char* names[] = {"f32",   "f16",   "q4_0",    "q4_1",   "q4_2",    "q4_3",  "q5_0",
                                "q5_1",  "q8_0",  "q8_1",    "q2_k",   "q3_k",    "q4_k",  "q5_k",
                                "q6_k",  "q8_k",  "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl",
                                "iq3_s", "iq2_s", "iq4_xs",  "i8",     "i16",     "i32",   "i64",
                                "f64",   "iq1_m", "bf16"};
  if (type < std::size(names)) return names[type];
  return fmt::format("type {}", type);
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("GGUF '{}': cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("GGUF '{}': not a regular file", path);
  }
  f->map_bytes_ = size_t(st.st_size);
  if (f->map_bytes_ < 8) {
    ::close(fd);
    fail("GGUF '{}': {} bytes is too short for a GGUF header", path, f->map_bytes_);
  }
  f->map_ = ::mmap(nullptr, f->map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (f->map_ == MAP_FAILED) {
    f->map_ = nullptr;
    fail("GGUF '{}': cannot map: {}", path, std::strerror(errno));
  }
  const auto* base = static_cast<const uint8_t*>(f->map_);
  Cursor c(base, f->map_bytes_, f->path_);
  if (std::memcmp(base, "GGUF", 4) != 0) fail("GGUF '{}': no GGUF magic (not a GGUF file)", path);
  c.get<uint32_t>("magic");
  f->version_ = c.get<uint32_t>("version");
  if (f->version_ != 2 && f->version_ != 3)
    fail("GGUF '{}': version {} (Nekton reads versions 2 and 3)", path, f->version_);
  const uint64_t n_tensors = c.get<uint64_t>("tensor count");
  const uint64_t n_kv = c.get<uint64_t>("metadata count");
  if (n_tensors > kMaxCount || n_kv > kMaxCount)
    fail("GGUF '{}': implausible counts ({} tensors, {} metadata keys)", path, n_tensors, n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string(fmt::format("metadata key {}", i));
    const uint32_t type = c.get<uint32_t>("value type of '" + key + "'");
    const size_t at = c.pos();
    Value v = read_value(c, type, "'" + key + "'");
    f->raw_kv_.push_back(
        {key, type, std::string(reinterpret_cast<const char*>(base + at), c.pos() - at)});
    if (!f->kv_.emplace(key, std::move(v)).second)
      fail("GGUF '{}': key '{}' appears twice", path, key);
  }
  const int64_t alignment = f->get_int("general.alignment", 32);
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0)
    fail("GGUF '{}': general.alignment = {} is not a power of two", path, alignment);
  struct Raw {
    uint64_t offset;
  };
  std::vector<Raw> raw;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = c.string(fmt::format("tensor {} name", i));
    const std::string what = "tensor '" + t.name + "'";
    const uint32_t dims = c.get<uint32_t>(what + " dimensions");
    if (dims == 0 || dims > kMaxDims) c.bad(fmt::format("{} has {} dimensions", what, dims));
    // ggml's order (ne[0] the row length); the whole shape is read before it
    // is judged, so a message names the dimension that is wrong.
    std::vector<uint64_t> raw_ne(dims);
    for (uint32_t d = 0; d < dims; ++d) raw_ne[d] = c.get<uint64_t>(what + " shape");
    std::vector<int64_t> ne(dims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const uint64_t v = raw_ne[d];
      if (v == 0 || v > kMaxDim)
        c.bad(fmt::format("{} has an implausible dimension ne[{}] = {} (ggml shape [{}])", what, d,
                          v, fmt::join(raw_ne, ", ")));
      if (numel > kMaxElements / int64_t(v))
        c.bad(fmt::format("{} has ggml shape [{}]: more than {} elements", what,
                          fmt::join(raw_ne, ", "), kMaxElements));
      ne[d] = int64_t(v);
      numel *= int64_t(v);
    }
    t.shape.assign(ne.rbegin(), ne.rend());
    t.type = c.get<uint32_t>(what + " type");
    raw.push_back({c.get<uint64_t>(what + " offset")});
    if (f->index_.count(t.name)) fail("GGUF '{}': tensor '{}' appears twice", path, t.name);
    switch (t.type) {
      case uint32_t(GgmlType::F32):
      case uint32_t(GgmlType::F16):
      case uint32_t(GgmlType::BF16):
      case uint32_t(GgmlType::Q8_0):
      case uint32_t(GgmlType::Q4_0):
      case uint32_t(GgmlType::Q4_K):
      case uint32_t(GgmlType::Q6_K):
        t.known = true;
        if (ne[0] % ggml_block(GgmlType(t.type)) != 0)
          fail("GGUF '{}': tensor '{}' of type {} has rows of {} values, not a multiple of {}",
               path, t.name, ggml_type_number_name(t.type), ne[0], ggml_block(GgmlType(t.type)));
        t.bytes = ggml_nbytes(GgmlType(t.type), numel);
        break;
      default:
        break;
    }
    f->index_[t.name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t));
  }
  const uint64_t data0 = (c.pos() + uint64_t(alignment) - 1) / uint64_t(alignment) * alignment;
  for (size_t i = 0; i < f->tensors_.size(); ++i) {
    TensorInfo& t = f->tensors_[i];
    const uint64_t off = raw[i].offset;
    if (off % uint64_t(alignment) != 0)
      fail("GGUF '{}': tensor '{}' starts at data offset {}, not a multiple of the alignment {}",
           path, t.name, off, alignment);
    if (!t.known) continue;  // its size is unknown: refused by whoever asks for it
    if (data0 > f->map_bytes_ || off > f->map_bytes_ - data0 ||
        t.bytes > f->map_bytes_ - data0 - off)
      fail(
          "GGUF '{}': tensor '{}' ({} bytes at data offset {}) runs past the end of the file "
          "({} bytes): the file is truncated",
          path, t.name, t.bytes, off, f->map_bytes_);
    t.data = base + data0 + off;
  }
  return f;
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

const GgufFile::Value& GgufFile::value(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) fail("GGUF '{}': metadata key '{}' is missing", path_, key);
  return it->second;
}

const GgufFile::Scalar& GgufFile::scalar(const std::string& key, const char* want) const {
  const Value& v = value(key);
  if (v.index() != 0)
    fail("GGUF '{}': metadata key '{}' is an array, expected {}", path_, key, want);
  return std::get<Scalar>(v);
}

std::string GgufFile::get_string(const std::string& key) const {
  const Scalar& s = scalar(key, "a string");
  if (s.index() != 3)
    fail("GGUF '{}': metadata key '{}' is {}, expected a string", path_, key, kind_of(s));
  return std::get<std::string>(s);
}

int64_t GgufFile::get_int(const std::string& key) const {
  const Scalar& s = scalar(key, "an integer");
  if (s.index() != 0)
    fail("GGUF '{}': metadata key '{}' is {}, expected an integer", path_, key, kind_of(s));
  return std::get<int64_t>(s);
}

double GgufFile::get_float(const std::string& key) const {
  const Scalar& s = scalar(key, "a number");
  if (s.index() == 0) return double(std::get<int64_t>(s));
  if (s.index() != 1)
    fail("GGUF '{}': metadata key '{}' is {}, expected a number", path_, key, kind_of(s));
  return std::get<double>(s);
}

bool GgufFile::get_bool(const std::string& key) const {
  const Scalar& s = scalar(key, "a bool");
  if (s.index() != 2)
    fail("GGUF '{}': metadata key '{}' is {}, expected a bool", path_, key, kind_of(s));
  return std::get<bool>(s);
}

namespace {

template <typename T, size_t I>
std::vector<T> array_of(const GgufFile::Value& v, const std::string& path, const std::string& key,
                        const char* want) {
  if (v.index() != 1) fail("GGUF '{}': metadata key '{}' is not an array of {}", path, key, want);
  std::vector<T> out;
  const auto& a = std::get<1>(v);
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].index() == I) {
      out.push_back(T(std::get<I>(a[i])));
    } else if constexpr (std::is_same_v<T, double>) {
      if (a[i].index() != 0)
        fail("GGUF '{}': element {} of '{}' is {}, expected a number", path, i, key, kind_of(a[i]));
      out.push_back(double(std::get<int64_t>(a[i])));
    } else {
      fail("GGUF '{}': element {} of '{}' is {}, expected {}", path, i, key, kind_of(a[i]), want);
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> GgufFile::get_strings(const std::string& key) const {
  return array_of<std::string, 3>(value(key), path_, key, "strings");
}

std::vector<double> GgufFile::get_floats(const std::string& key) const {
  return array_of<double, 1>(value(key), path_, key, "numbers");
}

std::vector<int64_t> GgufFile::get_ints(const std::string& key) const {
  return array_of<int64_t, 0>(value(key), path_, key, "integers");
}

std::string GgufFile::get_string(const std::string& key, const std::string& def) const {
  return has(key) ? get_string(key) : def;
}
int64_t GgufFile::get_int(const std::string& key, int64_t def) const {
  return has(key) ? get_int(key) : def;
}
double GgufFile::get_float(const std::string& key, double def) const {
  return has(key) ? get_float(key) : def;
}
bool GgufFile::get_bool(const std::string& key, bool def) const {
  return has(key) ? get_bool(key) : def;
}

const GgufFile::TensorInfo* GgufFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufFile::TensorInfo& GgufFile::tensor(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) fail("GGUF '{}': tensor '{}' is missing", path_, name);
  return *t;
}

}  // namespace nk
