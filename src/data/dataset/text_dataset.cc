#include "data/dataset/text_dataset.h"

#include <zlib.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "data/tokenizer/byte_tokenizer.h"
#include "data/utf8.h"

namespace nk {

namespace {

// Drops a multi-byte character cut in half at the end of `s`.
void cut_to_char_boundary(std::string& s) {
  size_t q = s.size();
  while (q > 0 && s.size() - q < 3 && (static_cast<unsigned char>(s[q - 1]) & 0xC0) == 0x80) --q;
  if (q == 0) return;
  unsigned lead = static_cast<unsigned char>(s[q - 1]);
  if (lead < 0xC0 || lead > 0xF7) return;  // not a lead byte: leave it to the validator
  size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  if (s.size() - (q - 1) < want) s.resize(q - 1);
}

bool is_gzip_name(const std::string& path) {
  auto ends = [&](const char* suf) {
    size_t n = std::strlen(suf);
    return path.size() >= n && path.compare(path.size() - n, n, suf) == 0;
  };
  return ends(".gz") || ends(".dz");  // .dz: dictzip, gzip-compatible (dict-gcide)
}

// The first `max_bytes` decompressed bytes of a gzip file (all for 0).
std::string read_gzip_prefix(const std::string& path, int64_t max_bytes) {
  if (::access(path.c_str(), R_OK) != 0) {
    if (errno == ENOENT) fail("corpus file '{}' not found", path);
    fail("cannot read corpus '{}': {}", path, std::strerror(errno));
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) fail("cannot read corpus '{}'", path);
  gzbuffer(f, 1 << 20);
  std::string buf;
  size_t limit = max_bytes > 0 ? size_t(max_bytes) : SIZE_MAX;
  const size_t chunk = 1 << 22;
  while (buf.size() < limit) {
    size_t want = std::min(chunk, limit - buf.size()), at = buf.size();
    buf.resize(at + want);
    int r = gzread(f, buf.data() + at, unsigned(want));
    if (r < 0) {
      int code;
      std::string msg = gzerror(f, &code);
      gzclose(f);
      fail("corpus '{}': corrupt gzip data: {}", path, msg);
    }
    buf.resize(at + size_t(r));
    if (size_t(r) < want) break;
  }
  gzclose(f);
  if (buf.size() == limit) cut_to_char_boundary(buf);
  return buf;
}

// The first `max_bytes` bytes of the file (all of it for 0).
std::string read_prefix(const std::string& path, int64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) fail("corpus file '{}' not found", path);
    fail("cannot read corpus '{}': {}", path, std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("cannot read corpus '{}': not a regular file", path);
  }
  size_t want = size_t(st.st_size);
  if (max_bytes > 0 && size_t(max_bytes) < want) want = size_t(max_bytes);
  std::string buf(want, '\0');
  size_t got = 0;
  while (got < want) {
    ssize_t r = ::read(fd, buf.data() + got, want - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int err = errno;
      ::close(fd);
      fail("cannot read corpus '{}': {}", path, std::strerror(err));
    }
    if (r == 0) break;  // shrank while reading: use what is there
    got += size_t(r);
  }
  ::close(fd);
  buf.resize(got);
  if (max_bytes > 0 && size_t(max_bytes) < size_t(st.st_size)) cut_to_char_boundary(buf);
  return buf;
}

}  // namespace

std::string read_text_file(const std::string& path, int64_t max_bytes) {
  if (max_bytes < 0) fail("corpus '{}': max_bytes must be >= 0, got {}", path, max_bytes);
  return is_gzip_name(path) ? read_gzip_prefix(path, max_bytes) : read_prefix(path, max_bytes);
}

TextCorpus TextCorpus::load(const std::string& path, double val_fraction, int64_t max_bytes,
                            bool replace_invalid) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    fail("corpus '{}': val_fraction must be in [0, 1), got {}", path, val_fraction);
  std::string text = read_text_file(path, max_bytes);
  if (text.empty()) fail("corpus '{}' is empty", path);
  int64_t bad = find_invalid_utf8(text);
  TextCorpus c;
  if (bad >= 0 && !replace_invalid) fail("{}: invalid UTF-8 at byte offset {}", path, bad);
  if (bad >= 0) text = replace_invalid_utf8(text, &c.replaced);

  std::vector<int32_t> ids = ByteTokenizer().encode(text);
  size_t n_val = size_t(double(ids.size()) * val_fraction);
  c.val.assign(ids.end() - ptrdiff_t(n_val), ids.end());
  ids.resize(ids.size() - n_val);
  c.train = std::move(ids);
  return c;
}

namespace {
uint64_t mix64(uint64_t z) {  // splitmix64 finaliser: a bijection with full avalanche
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Window i of a stream of n tokens: starts 0..n-T-1, so T+1 tokens always fit.
int64_t window_start(uint64_t seed, uint64_t i, int64_t n, int64_t T) {
  return int64_t(mix64(mix64(seed) ^ i) % uint64_t(n - T));
}
}  // namespace

TokenLoader::TokenLoader(const std::vector<int32_t>* tokens, int64_t B, int64_t T, uint64_t seed)
    : tokens_(tokens), B_(B), T_(T), seed_(seed) {
  NK_CHECK(tokens != nullptr, "TokenLoader needs a token vector");
  if (B <= 0) fail("batch size must be positive, got {}", B);
  if (T <= 0) fail("seq_len must be positive, got {}", T);
  int64_t n = int64_t(tokens->size());
  if (n < T + 1) fail("corpus too small: {} tokens, need at least {} for seq_len {}", n, T + 1, T);
}

int64_t TokenLoader::window_start(uint64_t i) const {
  return nk::window_start(seed_, i, int64_t(tokens_->size()), T_);
}

TextWindowDataset::TextWindowDataset(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t T,
                                     uint64_t seed, std::string name)
    : tokens_(std::move(tokens)), T_(T), seed_(seed), name_(std::move(name)) {
  NK_CHECK(tokens_ != nullptr, "TextWindowDataset needs tokens");
  if (T <= 0) fail("{}: seq_len must be positive, got {}", name_, T);
  int64_t n = int64_t(tokens_->size());
  if (n < T + 1) fail("{}: {} tokens, need at least {} for seq_len {}", name_, n, T + 1, T);
}

void TextWindowDataset::sample(int64_t i, int32_t* out) const {
  int64_t at = nk::window_start(seed_, uint64_t(i), int64_t(tokens_->size()), T_);
  std::memcpy(out, tokens_->data() + at, size_t(T_ + 1) * sizeof(int32_t));
}

void TokenLoader::next(Tensor inputs, Tensor targets) {
  for (const Tensor* t : {&inputs, &targets}) {
    check_shape(*t, {B_, T_}, t == &inputs ? "inputs" : "targets");
    check_dtype(*t, DType::I32, t == &inputs ? "inputs" : "targets");
    NK_CHECK(t->on_host() && t->is_contiguous(), "loader output must be host memory, dense");
  }
  int32_t* x = inputs.data<int32_t>();
  int32_t* y = targets.data<int32_t>();
  const int32_t* tok = tokens_->data();
  for (int64_t b = 0; b < B_; ++b) {
    const int32_t* w = tok + window_start(consumed_++);
    std::memcpy(x + b * T_, w, size_t(T_) * sizeof(int32_t));
    std::memcpy(y + b * T_, w + 1, size_t(T_) * sizeof(int32_t));
  }
}

}  // namespace nk
