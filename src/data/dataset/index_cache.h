// Index arrays (document, sample, shuffle and blending indices) built once and
// kept in files named by a hash of everything that defines them, so a later run
// with the same settings loads them instead of rebuilding. Layout of one file:
//   "NKINDEX\0"  u64 version=1  u64 description hash  u64 element bytes  u64 count
//   payload (count elements, little-endian)  u64 checksum of the payload
// A file that is missing, truncated, for another description or whose checksum
// disagrees is not used (a warning names it) and the caller rebuilds it.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace nk {

// 64-bit FNV-1a: the name hash of a cache description (stable across machines).
uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h = 0xcbf29ce484222325ull);
// Word-at-a-time hash of a payload (corruption check, not cryptographic).
uint64_t payload_checksum(const void* data, size_t bytes);

class IndexCache {
 public:
  // dir: the folder holding the files ("" keeps indices in memory only);
  // kind: "GPTDataset-train", "BlendedDataset-valid", ...; description: the text
  // whose hash names the files (also written beside them as HASH-KIND-description.txt).
  IndexCache(std::string dir, std::string kind, std::string description);

  const std::string& description() const { return description_; }
  uint64_t hash() const { return hash_; }
  std::string hash_hex() const;
  // DIR/HASH-KIND-what.bin
  std::string path(const std::string& what) const;

  // True when `what` was read and is valid; false (a warning if a file was there
  // but unusable) otherwise, leaving `out` empty.
  template <typename T>
  bool load(const std::string& what, std::vector<T>& out) const {
    std::string bytes;
    out.clear();
    if (!load_bytes(what, sizeof(T), &bytes)) return false;
    out.resize(bytes.size() / sizeof(T));
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return true;
  }
  // Writes `what` atomically. A folder that cannot be written is not an error:
  // a warning says so, once, and the indices stay in memory only.
  template <typename T>
  void save(const std::string& what, const std::vector<T>& v) const {
    save_bytes(what, sizeof(T), v.data(), v.size());
  }

 private:
  bool load_bytes(const std::string& what, size_t elem, std::string* out) const;
  void save_bytes(const std::string& what, size_t elem, const void* data, size_t count) const;
  std::string dir_, kind_, description_;
  uint64_t hash_;
  mutable bool warned_unwritable_ = false;
};

}  // namespace nk
