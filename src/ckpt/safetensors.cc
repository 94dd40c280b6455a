#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "ops/ops.h"

namespace nk {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps");

namespace {

using ojson = nlohmann::ordered_json;

// A header larger than this is not a real checkpoint (the HF reader uses the same bound).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {{DType::F32, "F32"}, {DType::BF16, "BF16"}, {DType::F16, "F16"},
                                 {DType::F64, "F64"}, {DType::I32, "I32"},   {DType::I64, "I64"},
                                 {DType::U8, "U8"}};

// Reads exactly n bytes at `offset`; false on a short read (file truncated meanwhile).
bool pread_all(int fd, void* dst, size_t n, size_t offset) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= size_t(got);
    offset += size_t(got);
  }
  return true;
}

// A JSON integer that is >= 0 and fits in uint64; nullopt otherwise.
std::optional<uint64_t> as_size(const ojson& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  return std::nullopt;
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const ojson& j,
                             uint64_t buffer_bytes) {
  auto bad = [&](const std::string& what) {
    return Error(fmt::format("{}: tensor '{}': {}", path, name, what));
  };
  if (!j.is_object()) throw bad("entry is not a JSON object");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!j.contains(field)) throw bad(fmt::format("missing '{}'", field));

  SafetensorsEntry e;
  e.name = name;
  const ojson& dt = j["dtype"];
  if (!dt.is_string()) throw bad("'dtype' is not a string");
  auto known = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                            [&](const DTypeName& d) { return dt.get<std::string>() == d.name; });
  if (known == std::end(kDTypes))
    throw bad(fmt::format("unsupported dtype '{}' (expected F32, BF16, F16, F64, I32, I64 or U8)",
                          dt.get<std::string>()));
  e.dtype = known->dtype;

  const ojson& shape = j["shape"];
  if (!shape.is_array()) throw bad("'shape' is not a list");
  uint64_t numel = 1;
  for (const ojson& d : shape) {
    auto n = as_size(d);
    if (!n || *n > uint64_t(INT64_MAX))
      throw bad(
          fmt::format("shape {} has a dimension that is not a non-negative integer", shape.dump()));
    if (__builtin_mul_overflow(numel, *n, &numel))
      throw bad("shape " + shape.dump() + " is too large");
    e.shape.push_back(int64_t(*n));
  }
  uint64_t need;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &need))
    throw bad("shape " + shape.dump() + " is too large");

  const ojson& off = j["data_offsets"];
  std::optional<uint64_t> b, en;
  if (off.is_array() && off.size() == 2) b = as_size(off[0]), en = as_size(off[1]);
  if (!b || !en) throw bad("'data_offsets' must be two non-negative integers [begin, end]");
  if (*b > *en) throw bad(fmt::format("data_offsets [{}, {}] are reversed", *b, *en));
  if (*en > buffer_bytes)
    throw bad(
        fmt::format("data_offsets end {} is beyond the data buffer ({} bytes)", *en, buffer_bytes));
  if (*en - *b != need)
    throw bad(fmt::format("data_offsets cover {} bytes but {}{} needs {}", *en - *b,
                          dt.get<std::string>(), shape_str(e.shape), need));
  e.begin = size_t(*b);
  e.end = size_t(*en);
  return e;
}

}  // namespace

struct SafetensorsFile::Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() { ::close(fd); }
};

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  fail("dtype {} has no safetensors name", dtype_name(t));
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) fail("safetensors file '{}' not found", path);
    fail("cannot open safetensors file '{}': {}", path, std::strerror(errno));
  }
  f.fd_ = std::make_shared<Fd>(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("cannot stat '{}': {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("'{}' is not a regular file", path);
  uint64_t file_bytes = uint64_t(st.st_size);
  if (file_bytes < 8)
    fail("{}: file is {} bytes, too short for a safetensors header", path, file_bytes);

  unsigned char len_le[8];
  if (!pread_all(fd, len_le, 8, 0)) fail("{}: cannot read the header length", path);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | len_le[i];
  if (header_bytes > kMaxHeaderBytes)
    fail("{}: header length {} is implausible (over {} bytes); not a safetensors file?", path,
         header_bytes, kMaxHeaderBytes);
  if (header_bytes > file_bytes - 8)
    fail("{}: header length {} exceeds the {} bytes after the length field (truncated file?)", path,
         header_bytes, file_bytes - 8);
  std::string text(header_bytes, '\0');
  if (!pread_all(fd, text.data(), header_bytes, 8)) fail("{}: cannot read the header", path);
  f.data_start_ = 8 + header_bytes;
  uint64_t buffer_bytes = file_bytes - f.data_start_;

  // JSON objects may repeat a key and parsers keep one silently; a checkpoint
  // with two tensors of one name is corrupt, so catch it while parsing.
  std::set<std::string> seen;
  auto on_event = [&](int depth, ojson::parse_event_t ev, ojson& parsed) {
    if (ev == ojson::parse_event_t::key && depth == 1 &&
        !seen.insert(parsed.get<std::string>()).second)
      fail("{}: tensor '{}' appears twice in the header", path, parsed.get<std::string>());
    return true;
  };
  ojson header;
  try {
    header = ojson::parse(text, on_event);
  } catch (const ojson::exception& e) {
    fail("{}: header is not valid JSON: {}", path, e.what());
  }
  if (!header.is_object()) fail("{}: header is not a JSON object", path);

  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) fail("{}: __metadata__ is not a JSON object", path);
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) fail("{}: __metadata__ value for '{}' is not a string", path, k);
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    f.entries_.push_back(parse_entry(path, name, value, buffer_bytes));
  }

  // Data order; empty tensors occupy no bytes and cannot overlap anything.
  std::stable_sort(f.entries_.begin(), f.entries_.end(),
                   [](const auto& a, const auto& b) { return a.begin < b.begin; });
  const SafetensorsEntry* last = nullptr;  // the non-empty tensor reaching furthest so far
  for (const auto& e : f.entries_) {
    if (e.begin == e.end) continue;
    if (last && e.begin < last->end)
      fail("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", path, last->name, last->begin,
           last->end, e.name, e.begin, e.end);
    if (!last || e.end > last->end) last = &e;
  }
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_[f.entries_[i].name] = i;
  return f;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("{}: no tensor named '{}'", path_, name);
  return entries_[it->second];
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  Tensor t = Tensor::empty(e.shape, e.dtype);
  if (e.end > e.begin && !pread_all(fd_->fd, t.raw(), e.end - e.begin, data_start_ + e.begin))
    fail("{}: cannot read tensor '{}' (file truncated?)", path_, name);
  return t;
}

void SafetensorsFile::read_into(const std::string& name, const Tensor& dst) const {
  const SafetensorsEntry& e = entry(name);
  if (!dst.defined() || !dst.is_contiguous() || dst.dtype() != e.dtype ||
      dst.numel() != shape_numel(e.shape))
    fail("{}: tensor '{}' is {}{}, cannot be read into {}", path_, name,
         safetensors_dtype_name(e.dtype), shape_str(e.shape), dst.desc());
  // A device tensor is read through a host copy of its own size.
  const Tensor host = dst.on_host() ? dst : Tensor::empty(dst.shape(), dst.dtype());
  if (e.end > e.begin && !pread_all(fd_->fd, host.raw(), e.end - e.begin, data_start_ + e.begin))
    fail("{}: cannot read tensor '{}' (file truncated?)", path_, name);
  if (!dst.on_host()) ops::copy_bytes_from_host(dst, host.raw());
}

void SafetensorsFile::read_slices_into(const std::string& name,
                                       const std::vector<SliceRange>& ranges,
                                       const Tensor& device_dst) const {
  const SafetensorsEntry& e = entry(name);
  // A device tensor is read through a host copy holding its current contents
  // (the slices may cover part of it).
  Tensor dst = device_dst;
  if (device_dst.defined() && !device_dst.on_host()) {
    dst = Tensor::empty(device_dst.shape(), device_dst.dtype());
    ops::copy_bytes_to_host(device_dst, dst.raw());
  }
  NK_CHECK(dst.defined() && dst.is_contiguous() && dst.dtype() == e.dtype && !e.shape.empty() &&
               dst.ndim() == int64_t(e.shape.size()),
           "{}: tensor '{}' {} cannot be read into {}", path_, name, shape_str(e.shape),
           dst.desc());
  const size_t elem = dtype_size(e.dtype);
  const int64_t rows = e.shape[0], row = shape_numel(e.shape) / std::max<int64_t>(rows, 1);
  auto read = [&](void* to, int64_t elements, int64_t at) {
    if (elements > 0 &&
        !pread_all(fd_->fd, to, size_t(elements) * elem, data_start_ + e.begin + size_t(at) * elem))
      fail("{}: cannot read tensor '{}' (file truncated?)", path_, name);
  };
  char* out = static_cast<char*>(dst.raw());
  for (const SliceRange& r : ranges) {
    // The shard keeps the other dimension whole: the row size, or (columns) every row.
    const bool whole_other = r.dim == 0 ? dst.numel() == dst.dim(0) * row : dst.dim(0) == rows;
    NK_CHECK((r.dim == 0 || (r.dim == 1 && e.shape.size() == 2)) && whole_other && r.start >= 0 &&
                 r.len >= 0 && r.start + r.len <= e.shape[size_t(r.dim)] && r.local_start >= 0 &&
                 r.local_start + r.len <= dst.dim(r.dim),
             "{}: slice [{}, +{}) of dim {} outside tensor '{}' {} or {}", path_, r.start, r.len,
             r.dim, name, shape_str(e.shape), dst.desc());
    if (r.dim == 0) {
      read(out + size_t(r.local_start * row) * elem, r.len * row, r.start * row);
      continue;
    }
    for (int64_t i = 0; i < rows; ++i)
      read(out + size_t(i * dst.dim(1) + r.local_start) * elem, r.len, i * row + r.start);
  }
  if (!device_dst.on_host()) ops::copy_bytes_from_host(device_dst, dst.raw());
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  ojson header = ojson::object();
  if (!metadata.empty()) {
    ojson meta = ojson::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    NK_CHECK(t.defined() && t.is_contiguous(), "tensor '{}' must be a defined, contiguous tensor",
             name);
    NK_CHECK(!name.empty() && name != "__metadata__" && !header.contains(name),
             "bad or repeated tensor name '{}'", name);
    ojson entry = ojson::object();
    entry["dtype"] = safetensors_dtype_name(t.dtype());
    entry["shape"] = t.shape();
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    header[name] = std::move(entry);
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const ojson::exception& e) {
    fail("cannot write '{}': a tensor name or metadata entry is not valid UTF-8", path);
  }
  // Pad with spaces so the data buffer starts 8-byte aligned, as the HF writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();
  unsigned char len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = uint8_t(n >> (8 * i));

  AtomicFileWriter w(path);
  w.write(len_le, 8);
  w.write(text.data(), text.size());
  for (const auto& [name, t] : tensors) {
    if (t.nbytes() == 0) continue;
    if (t.on_host()) {
      w.write(t.raw(), t.nbytes());
      continue;
    }
    // A device tensor goes through a host copy, one tensor at a time.
    const Tensor host = Tensor::empty(t.shape(), t.dtype());
    ops::copy_bytes_to_host(t, host.raw());
    w.write(host.raw(), host.nbytes());
  }
  w.commit();
}

}  // namespace nk
