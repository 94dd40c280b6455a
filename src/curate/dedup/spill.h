// Disk spilling for the global stages, so deduplication works on corpora
// larger than memory.
//
//   AppendFile        one binary file written by appending, read back by offset
//   IndexedLog        variable-length records numbered 0, 1, 2, ... in append
//                     order: DIR/NAME.bin holds the bytes, DIR/NAME.idx one
//                     little-endian u64 end offset per record
//   PartitionedSpill  fixed-size records hashed into P partitions; records are
//                     held in memory up to a byte budget, then every buffer is
//                     appended to DIR/part-NNNNN.bin. A partition that is still
//                     too large when it is read back is split again by other
//                     hash bits (DIR/part-NNNNN.split/...).
//
// All files are scratch files inside the stage's work folder, which the runner
// removes; they are not written atomically.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace nk::curate {

class AppendFile {
 public:
  AppendFile() = default;
  explicit AppendFile(std::string path);  // created empty; nk::Error naming it on failure
  ~AppendFile();
  AppendFile(AppendFile&& o) noexcept;
  AppendFile& operator=(AppendFile&& o) noexcept;

  void append(const void* data, size_t bytes);
  void flush();                            // pending bytes to the file (before reading back)
  uint64_t size() const { return size_; }  // bytes appended so far
  // Reads [offset, offset + bytes) of what was flushed; safe from many threads.
  void read(uint64_t offset, void* dst, size_t bytes) const;
  const std::string& path() const { return path_; }

 private:
  void close() noexcept;
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::vector<char> buf_;
};

class IndexedLog {
 public:
  IndexedLog() = default;
  IndexedLog(const std::string& dir, const std::string& name);
  void append(const void* data, size_t bytes);
  void append(std::string_view s) { append(s.data(), s.size()); }
  void flush();  // before get()
  uint64_t count() const { return count_; }
  uint64_t bytes() const { return data_.size() + idx_.size(); }
  // Record i as raw bytes; thread-safe after flush().
  std::string get(uint64_t i) const;

 private:
  AppendFile data_, idx_;
  uint64_t count_ = 0;
};

// Mixes a record's partition key with the split level, so that the records
// of one partition spread again when it is split.
inline uint32_t partition_of(uint64_t key, uint32_t level, uint32_t parts) {
  uint64_t h = (key ^ (0x9e3779b97f4a7c15ull * (level + 1))) * 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 29;
  return uint32_t(h % parts);
}

// R: trivially copyable with `uint64_t partition_key() const`.
template <class R>
class PartitionedSpill {
  static_assert(std::is_trivially_copyable_v<R>);

 public:
  PartitionedSpill() = default;
  // `dir` is created; `budget_bytes` bounds the records held in memory.
  PartitionedSpill(std::string dir, uint32_t parts, uint64_t budget_bytes, uint32_t level = 0)
      : dir_(std::move(dir)), level_(level), budget_(budget_bytes), buffers_(parts) {
    std::filesystem::create_directories(dir_);
  }

  uint32_t parts() const { return uint32_t(buffers_.size()); }
  uint64_t bytes_spilled() const { return spilled_; }
  uint64_t records() const { return records_; }

  void add(const R& r) {
    buffers_[partition_of(r.partition_key(), level_, parts())].push_back(r);
    ++records_;
    if (++buffered_ * sizeof(R) >= budget_) spill();
  }

  // Calls fn with all records of partition p, in no particular order. When
  // the partition holds more than `max_bytes` it is split by other hash bits
  // and fn is called once per piece (records with equal keys stay together);
  // the bytes that split writes are added to *split_bytes.
  void visit(uint32_t p, uint64_t max_bytes, const std::function<void(std::vector<R>&)>& fn,
             uint64_t* split_bytes) const {
    uint64_t on_disk = std::filesystem::exists(file(p)) ? std::filesystem::file_size(file(p)) : 0;
    uint64_t total = on_disk + buffers_[p].size() * sizeof(R);
    if (total > max_bytes && level_ < 4 && total > sizeof(R)) {
      // Stream the partition into 16 pieces, a budget's worth at a time.
      PartitionedSpill<R> sub(file(p) + ".split", 16, max_bytes, level_ + 1);
      for_each_chunk(p, max_bytes, [&](const R* r, size_t n) {
        for (size_t i = 0; i < n; ++i) sub.add(r[i]);
      });
      sub.spill();
      *split_bytes += sub.bytes_spilled();
      for (uint32_t q = 0; q < sub.parts(); ++q) sub.visit(q, max_bytes, fn, split_bytes);
      std::filesystem::remove_all(sub.dir_);
      return;
    }
    std::vector<R> all(total / sizeof(R));
    size_t at = 0;
    for_each_chunk(p, max_bytes, [&](const R* r, size_t n) {
      std::memcpy(all.data() + at, r, n * sizeof(R));
      at += n;
    });
    fn(all);
  }

  // Writes every buffered record to its partition file.
  void spill() {
    for (uint32_t p = 0; p < parts(); ++p) {
      std::vector<R>& b = buffers_[p];
      if (b.empty()) continue;
      append_to(file(p), b.data(), b.size() * sizeof(R));
      spilled_ += b.size() * sizeof(R);
      std::vector<R>().swap(b);
    }
    buffered_ = 0;
  }

 private:
  std::string file(uint32_t p) const;

  // fn(records, count) over the file's records, then the buffered ones.
  void for_each_chunk(uint32_t p, uint64_t chunk_bytes,
                      const std::function<void(const R*, size_t)>& fn) const {
    std::string path = file(p);
    if (std::filesystem::exists(path)) {
      size_t per = std::max<size_t>(1, size_t(chunk_bytes / sizeof(R)));
      per = std::min<size_t>(per, size_t(1) << 20);
      read_records(path, sizeof(R), per,
                   [&](const void* data, size_t n) { fn(static_cast<const R*>(data), n); });
    }
    if (!buffers_[p].empty()) fn(buffers_[p].data(), buffers_[p].size());
  }

  static void append_to(const std::string& path, const void* data, size_t bytes);
  static void read_records(const std::string& path, size_t record_bytes, size_t per_chunk,
                           const std::function<void(const void*, size_t)>& fn);

  std::string dir_;
  uint32_t level_ = 0;
  uint64_t budget_ = 0, buffered_ = 0, spilled_ = 0, records_ = 0;
  std::vector<std::vector<R>> buffers_;
};

// Non-template helpers of PartitionedSpill (spill.cc).
std::string spill_part_file(const std::string& dir, uint32_t p);
void spill_append(const std::string& path, const void* data, size_t bytes);
void spill_read_records(const std::string& path, size_t record_bytes, size_t per_chunk,
                        const std::function<void(const void*, size_t)>& fn);

template <class R>
std::string PartitionedSpill<R>::file(uint32_t p) const {
  return spill_part_file(dir_, p);
}
template <class R>
void PartitionedSpill<R>::append_to(const std::string& path, const void* data, size_t bytes) {
  spill_append(path, data, bytes);
}
template <class R>
void PartitionedSpill<R>::read_records(const std::string& path, size_t record_bytes,
                                       size_t per_chunk,
                                       const std::function<void(const void*, size_t)>& fn) {
  spill_read_records(path, record_bytes, per_chunk, fn);
}

}  // namespace nk::curate
