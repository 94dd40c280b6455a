#include "data/dataset/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"

namespace nk {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr int64_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

bool valid_dtype(uint8_t code) {
  return code >= 1 && code <= 8;
}

// Anonymous scratch file beside `near` (same filesystem, gone when closed).
std::FILE* scratch_file(const std::string& near) {
  std::string path = near + ".scratch." + std::to_string(::getpid());
  std::FILE* f = std::fopen(path.c_str(), "w+b");
  if (!f) fail("cannot create '{}': {}", path, std::strerror(errno));
  ::unlink(path.c_str());
  return f;
}

void put(std::FILE* f, const void* p, size_t n, const std::string& what) {
  if (n && std::fwrite(p, 1, n, f) != n) fail("cannot write '{}': {}", what, std::strerror(errno));
}

template <typename T>
void convert_tokens(std::span<const int32_t> src, char* dst, int64_t lo, int64_t hi,
                    const std::string& prefix) {
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] < lo || src[i] > hi)
      fail("'{}': token {} does not fit the dataset dtype [{}, {}]", prefix, src[i], lo, hi);
    T v = static_cast<T>(src[i]);
    std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
  }
}

// Copies the whole scratch file `f` into `out` (from its start).
void drain(std::FILE* f, AtomicFileWriter& out, const std::string& what) {
  std::rewind(f);
  std::vector<char> buf(size_t(1) << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.write(buf.data(), n);
  if (std::ferror(f)) fail("cannot read back '{}'", what);
}

}  // namespace

int64_t index_dtype_size(IndexDType t) {
  switch (t) {
    case IndexDType::U8:
    case IndexDType::I8:
      return 1;
    case IndexDType::I16:
    case IndexDType::U16:
      return 2;
    case IndexDType::I32:
    case IndexDType::F32:
      return 4;
    case IndexDType::I64:
    case IndexDType::F64:
      return 8;
  }
  return 0;
}

const char* index_dtype_name(IndexDType t) {
  static const char* names[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                "int64", "float64", "float32", "uint16"};
  uint8_t c = static_cast<uint8_t>(t);
  return valid_dtype(c) ? names[c] : "?";
}

IndexDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexDType::U16 : IndexDType::I32;
}

// ---- writer ----

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, IndexDType dtype)
    : prefix_(prefix), dtype_(dtype) {
  if (dtype != IndexDType::U16 && dtype != IndexDType::I32 && dtype != IndexDType::U8)
    fail("'{}': token datasets are written as uint8, uint16 or int32, not {}", prefix,
         index_dtype_name(dtype));
  bin_ = std::make_unique<AtomicFileWriter>(prefix + ".bin");
  lengths_ = scratch_file(prefix + ".idx");
  doc_ends_ = scratch_file(prefix + ".idx");
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (lengths_) std::fclose(lengths_);
  if (doc_ends_) std::fclose(doc_ends_);
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  NK_CHECK(!finished_, "add_sequence after finish on '{}'", prefix_);
  if (tokens.size() > size_t(INT32_MAX))
    fail("'{}': sequence of {} tokens is too long", prefix_, tokens.size());
  int64_t item = index_dtype_size(dtype_);
  conv_.resize(tokens.size() * item);
  switch (dtype_) {
    case IndexDType::U8:
      convert_tokens<uint8_t>(tokens, conv_.data(), 0, 255, prefix_);
      break;
    case IndexDType::U16:
      convert_tokens<uint16_t>(tokens, conv_.data(), 0, 65535, prefix_);
      break;
    default:
      convert_tokens<int32_t>(tokens, conv_.data(), INT32_MIN, INT32_MAX, prefix_);
      break;
  }
  bin_->write(conv_.data(), conv_.size());
  int32_t len = static_cast<int32_t>(tokens.size());
  put(lengths_, &len, sizeof len, prefix_ + ".idx");
  ++n_seq_;
  n_tok_ += len;
}

void IndexedDatasetWriter::end_document() {
  put(doc_ends_, &n_seq_, sizeof n_seq_, prefix_ + ".idx");
  ++n_doc_;
}

void IndexedDatasetWriter::finish() {
  NK_CHECK(!finished_, "finish twice on '{}'", prefix_);
  std::string idx_path = prefix_ + ".idx";
  if (std::fflush(lengths_) != 0 || std::fflush(doc_ends_) != 0)
    fail("cannot write '{}': {}", idx_path, std::strerror(errno));
  AtomicFileWriter idx(idx_path);
  idx.write(kMagic, sizeof kMagic);
  uint64_t version = 1, n_seq = n_seq_, n_doc_idx = n_doc_ + 1;
  uint8_t code = static_cast<uint8_t>(dtype_);
  idx.write(&version, 8);
  idx.write(&code, 1);
  idx.write(&n_seq, 8);
  idx.write(&n_doc_idx, 8);
  drain(lengths_, idx, idx_path);
  // Byte offsets follow from the lengths: a second pass over the scratch file.
  std::rewind(lengths_);
  int64_t item = index_dtype_size(dtype_), offset = 0;
  std::vector<int32_t> lens(1 << 16);
  std::vector<int64_t> offs(lens.size());
  size_t n;
  while ((n = std::fread(lens.data(), sizeof(int32_t), lens.size(), lengths_)) > 0) {
    for (size_t i = 0; i < n; ++i) {
      offs[i] = offset;
      offset += int64_t(lens[i]) * item;
    }
    idx.write(offs.data(), n * sizeof(int64_t));
  }
  int64_t zero = 0;
  idx.write(&zero, sizeof zero);
  drain(doc_ends_, idx, idx_path);
  // A crash from here on leaves no index under the final name rather than an
  // old index beside a new .bin.
  std::filesystem::remove(idx_path);
  bin_->commit();
  idx.commit();
  finished_ = true;
}

// ---- reader ----

std::shared_ptr<const IndexedDataset> IndexedDataset::open(const std::string& prefix) {
  std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  auto ds = std::shared_ptr<IndexedDataset>(new IndexedDataset());
  ds->prefix_ = prefix;

  std::FILE* f = std::fopen(idx_path.c_str(), "rb");
  if (!f) fail("cannot open '{}': {}", idx_path, std::strerror(errno));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(f, &std::fclose);
  std::error_code ec;
  int64_t idx_bytes = int64_t(std::filesystem::file_size(idx_path, ec));
  if (ec) fail("cannot read '{}': {}", idx_path, ec.message());
  if (idx_bytes < kHeaderBytes)
    fail("'{}': truncated header ({} bytes, need {})", idx_path, idx_bytes, kHeaderBytes);
  char magic[9];
  uint64_t version, n_seq, n_doc_idx;
  uint8_t code;
  bool ok = std::fread(magic, 1, 9, f) == 9 && std::fread(&version, 8, 1, f) == 1 &&
            std::fread(&code, 1, 1, f) == 1 && std::fread(&n_seq, 8, 1, f) == 1 &&
            std::fread(&n_doc_idx, 8, 1, f) == 1;
  if (!ok) fail("cannot read the header of '{}'", idx_path);
  if (std::memcmp(magic, kMagic, 9) != 0)
    fail("'{}': not a Megatron indexed dataset index (bad magic at byte 0)", idx_path);
  if (version != 1) fail("'{}': index version {} at byte 9, only 1 is known", idx_path, version);
  if (!valid_dtype(code)) fail("'{}': unknown dtype code {} at byte 17", idx_path, code);
  ds->dtype_ = static_cast<IndexDType>(code);
  if (ds->dtype_ == IndexDType::F32 || ds->dtype_ == IndexDType::F64)
    fail("'{}': dtype {} does not hold token ids", idx_path, index_dtype_name(ds->dtype_));
  // Overflow-safe size check before allocating anything.
  if (n_seq > uint64_t(idx_bytes) || n_doc_idx > uint64_t(idx_bytes))
    fail("'{}': header counts ({} sequences, {} document entries) exceed the file size {}",
         idx_path, n_seq, n_doc_idx, idx_bytes);
  int64_t want = kHeaderBytes + int64_t(n_seq) * 12 + int64_t(n_doc_idx) * 8;
  if (idx_bytes < want)
    fail(
        "'{}': truncated: {} bytes, the header promises {} sequences and {} document entries "
        "({} bytes)",
        idx_path, idx_bytes, n_seq, n_doc_idx, want);
  ds->n_seq_ = int64_t(n_seq);
  ds->lengths_.resize(n_seq);
  ds->offsets_.resize(n_seq);
  ds->doc_idx_.resize(n_doc_idx);
  ok = std::fread(ds->lengths_.data(), 4, n_seq, f) == n_seq &&
       std::fread(ds->offsets_.data(), 8, n_seq, f) == n_seq &&
       std::fread(ds->doc_idx_.data(), 8, n_doc_idx, f) == n_doc_idx;
  if (!ok) fail("cannot read the arrays of '{}'", idx_path);

  int64_t item = index_dtype_size(ds->dtype_);
  int64_t bin_bytes = int64_t(std::filesystem::file_size(bin_path, ec));
  if (ec) fail("cannot read '{}': {}", bin_path, ec.message());
  int64_t expect = 0;
  for (int64_t i = 0; i < ds->n_seq_; ++i) {
    int64_t len = ds->lengths_[i], off = ds->offsets_[i];
    int64_t at = kHeaderBytes + i * 4;
    if (len < 0) fail("'{}': sequence {} has negative length {} (byte {})", idx_path, i, len, at);
    if (off != expect)
      fail(
          "'{}': sequence {} starts at byte {} of the .bin, expected {} after the previous "
          "one (index byte {})",
          idx_path, i, off, expect, kHeaderBytes + n_seq * 4 + i * 8);
    expect = off + len * item;
    ds->n_tokens_ += len;
  }
  if (expect > bin_bytes)
    fail("'{}': truncated: {} bytes, the index needs {} ({} tokens of {})", bin_path, bin_bytes,
         expect, ds->n_tokens_, index_dtype_name(ds->dtype_));
  int64_t doc_at = kHeaderBytes + int64_t(n_seq) * 12;
  if (n_doc_idx < 1 || ds->doc_idx_[0] != 0)
    fail("'{}': the document index must start with 0 (byte {})", idx_path, doc_at);
  for (size_t d = 1; d < n_doc_idx; ++d)
    if (ds->doc_idx_[d] < ds->doc_idx_[d - 1] || ds->doc_idx_[d] > ds->n_seq_)
      fail("'{}': document index entry {} = {} is out of order or past {} sequences (byte {})",
           idx_path, d, ds->doc_idx_[d], n_seq, doc_at + int64_t(d) * 8);

  ds->bin_bytes_ = size_t(bin_bytes);
  if (bin_bytes > 0) {
    int fd = ::open(bin_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open '{}': {}", bin_path, std::strerror(errno));
    void* p = ::mmap(nullptr, size_t(bin_bytes), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) fail("cannot map '{}': {}", bin_path, std::strerror(errno));
    ds->bin_ = static_cast<const char*>(p);
  }
  return ds;
}

IndexedDataset::~IndexedDataset() {
  if (bin_) ::munmap(const_cast<char*>(bin_), bin_bytes_);
}

void IndexedDataset::read(int64_t seq, int64_t start, int64_t count, int32_t* out) const {
  NK_CHECK(seq >= 0 && seq < n_seq_ && start >= 0 && count >= 0 && start + count <= lengths_[seq],
           "read of sequence {} [{}, +{}) outside '{}'", seq, start, count, prefix_);
  // An empty read may come with no memory at all (out and bin_ null), which
  // memcpy does not allow even for zero bytes.
  if (count == 0) return;
  int64_t item = index_dtype_size(dtype_);
  const char* p = bin_ + offsets_[seq] + start * item;
  switch (dtype_) {
    case IndexDType::U8:
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<uint8_t>(p[i]);
      break;
    case IndexDType::I8:
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int8_t>(p[i]);
      break;
    case IndexDType::U16:
    case IndexDType::I16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        out[i] = dtype_ == IndexDType::U16 ? int32_t(v) : int32_t(int16_t(v));
      }
      break;
    case IndexDType::I32:
      std::memcpy(out, p, size_t(count) * 4);
      break;
    case IndexDType::I64:
      for (int64_t i = 0; i < count; ++i) {
        int64_t v;
        std::memcpy(&v, p + 8 * i, 8);
        if (v < INT32_MIN || v > INT32_MAX)
          fail("'{}.bin': token {} of sequence {} does not fit int32", prefix_, v, seq);
        out[i] = int32_t(v);
      }
      break;
    default:
      NK_CHECK(false, "float dtype in '{}'", prefix_);
  }
}

std::vector<int32_t> IndexedDataset::sequence(int64_t seq) const {
  NK_CHECK(seq >= 0 && seq < n_seq_, "sequence {} outside '{}'", seq, prefix_);
  std::vector<int32_t> out(static_cast<size_t>(lengths_[seq]));
  read(seq, 0, lengths_[seq], out.data());
  return out;
}

}  // namespace nk
