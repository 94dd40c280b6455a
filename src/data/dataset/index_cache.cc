#include "data/dataset/index_cache.h"

#include <cstdio>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"

namespace nk {
namespace {

constexpr char kCacheMagic[8] = {'N', 'K', 'I', 'N', 'D', 'E', 'X', 0};
constexpr uint64_t kVersion = 1;
constexpr size_t kCacheHeaderBytes = 8 + 4 * 8;

void put_u64(std::string& s, uint64_t v) {
  s.append(reinterpret_cast<const char*>(&v), 8);
}
uint64_t get_u64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t payload_checksum(const void* data, size_t bytes) {
  // Each 8-byte word, mixed with its position, through a splitmix64-style
  // finaliser; the sum detects flipped, swapped and truncated words.
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x9E3779B97F4A7C15ull ^ bytes;
  size_t i = 0;
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h += mix(w + i * 0x9E3779B97F4A7C15ull);
  }
  uint64_t tail = 0;
  if (bytes > i) std::memcpy(&tail, p + i, bytes - i);
  return h + mix(tail ^ 0xD1B54A32D192ED03ull);
}

IndexCache::IndexCache(std::string dir, std::string kind, std::string description)
    : dir_(std::move(dir)), kind_(std::move(kind)), description_(std::move(description)) {
  hash_ = fnv1a64(description_.data(), description_.size());
}

std::string IndexCache::hash_hex() const {
  return fmt::format("{:016x}", hash_);
}

std::string IndexCache::path(const std::string& what) const {
  return (std::filesystem::path(dir_) / (hash_hex() + "-" + kind_ + "-" + what + ".bin")).string();
}

bool IndexCache::load_bytes(const std::string& what, size_t elem, std::string* out) const {
  if (dir_.empty()) return false;
  std::string p = path(what);
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (!f) return false;
  std::string bytes;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.append(buf, n);
  bool read_error = std::ferror(f);
  std::fclose(f);
  auto reject = [&](const std::string& why) {
    NK_WARN("index cache '{}' is unusable ({}); rebuilding it", p, why);
    return false;
  };
  if (read_error) return reject("read error");
  if (bytes.size() < kCacheHeaderBytes + 8 || std::memcmp(bytes.data(), kCacheMagic, 8) != 0)
    return reject("not an index file or truncated");
  if (get_u64(bytes, 8) != kVersion) return reject("unknown version");
  if (get_u64(bytes, 16) != hash_) return reject("written for other settings");
  if (get_u64(bytes, 24) != elem) return reject("wrong element size");
  uint64_t count = get_u64(bytes, 32);
  if (count > (bytes.size() - kCacheHeaderBytes - 8) / elem ||
      bytes.size() != kCacheHeaderBytes + count * elem + 8)
    return reject(
        fmt::format("{} bytes, expected {}", bytes.size(), kCacheHeaderBytes + count * elem + 8));
  const char* payload = bytes.data() + kCacheHeaderBytes;
  if (payload_checksum(payload, count * elem) != get_u64(bytes, kCacheHeaderBytes + count * elem))
    return reject("checksum mismatch");
  out->assign(payload, count * elem);
  return true;
}

void IndexCache::save_bytes(const std::string& what, size_t elem, const void* data,
                            size_t count) const {
  if (dir_.empty()) return;
  try {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) fail("cannot create '{}': {}", dir_, ec.message());
    std::string desc_path =
        (std::filesystem::path(dir_) / (hash_hex() + "-" + kind_ + "-description.txt")).string();
    if (!std::filesystem::exists(desc_path)) write_file_atomic(desc_path, description_ + "\n");
    std::string header(kCacheMagic, 8);
    put_u64(header, kVersion);
    put_u64(header, hash_);
    put_u64(header, elem);
    put_u64(header, count);
    std::string trailer;
    put_u64(trailer, payload_checksum(data, count * elem));
    AtomicFileWriter w(path(what));
    w.write(header.data(), header.size());
    w.write(data, count * elem);
    w.write(trailer.data(), trailer.size());
    w.commit();
  } catch (const Error& e) {
    if (!warned_unwritable_)
      NK_WARN("cannot cache indices in '{}' ({}); they stay in memory only", dir_, e.what());
    warned_unwritable_ = true;
  }
}

}  // namespace nk
