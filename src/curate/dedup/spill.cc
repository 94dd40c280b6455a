#include "curate/dedup/spill.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include <fmt/format.h>

namespace nk::curate {

namespace {

constexpr size_t kAppendBuffer = size_t(1) << 20;

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("spill file {}: write failed: {}", path, std::strerror(errno));
    p += w;
    n -= size_t(w);
  }
}

void pread_all(int fd, char* p, size_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, off_t(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail("spill file {}: read at {} failed: {}", path, off,
           r == 0 ? "unexpected end of file" : std::strerror(errno));
    p += r;
    n -= size_t(r);
    off += uint64_t(r);
  }
}

}  // namespace

AppendFile::AppendFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("spill file {}: cannot create: {}", path_, std::strerror(errno));
}

AppendFile::~AppendFile() {
  close();
}

AppendFile::AppendFile(AppendFile&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), size_(o.size_), buf_(std::move(o.buf_)) {
  o.fd_ = -1;
}

AppendFile& AppendFile::operator=(AppendFile&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    size_ = o.size_;
    buf_ = std::move(o.buf_);
    o.fd_ = -1;
  }
  return *this;
}

void AppendFile::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void AppendFile::append(const void* data, size_t bytes) {
  NK_CHECK(fd_ >= 0, "append to a closed spill file");
  const char* p = static_cast<const char*>(data);
  size_ += bytes;
  if (buf_.size() + bytes > kAppendBuffer) flush();
  if (bytes >= kAppendBuffer) {
    write_all(fd_, p, bytes, path_);
    return;
  }
  buf_.insert(buf_.end(), p, p + bytes);
}

void AppendFile::flush() {
  if (buf_.empty()) return;
  write_all(fd_, buf_.data(), buf_.size(), path_);
  buf_.clear();
}

void AppendFile::read(uint64_t offset, void* dst, size_t bytes) const {
  NK_CHECK(offset + bytes <= size_ - buf_.size(), "spill read past what was flushed");
  pread_all(fd_, static_cast<char*>(dst), bytes, offset, path_);
}

IndexedLog::IndexedLog(const std::string& dir, const std::string& name)
    : data_(dir + "/" + name + ".bin"), idx_(dir + "/" + name + ".idx") {}

void IndexedLog::append(const void* data, size_t bytes) {
  data_.append(data, bytes);
  uint64_t end = data_.size();
  idx_.append(&end, sizeof(end));
  ++count_;
}

void IndexedLog::flush() {
  data_.flush();
  idx_.flush();
}

std::string IndexedLog::get(uint64_t i) const {
  NK_CHECK(i < count_, "record {} of {}", i, count_);
  uint64_t range[2] = {0, 0};
  if (i == 0)
    idx_.read(0, &range[1], sizeof(uint64_t));
  else
    idx_.read((i - 1) * sizeof(uint64_t), range, 2 * sizeof(uint64_t));
  std::string out(range[1] - range[0], '\0');
  if (!out.empty()) data_.read(range[0], out.data(), out.size());
  return out;
}

std::string spill_part_file(const std::string& dir, uint32_t p) {
  return fmt::format("{}/part-{:05d}.bin", dir, p);
}

void spill_append(const std::string& path, const void* data, size_t bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) fail("spill file {}: cannot open: {}", path, std::strerror(errno));
  try {
    write_all(fd, static_cast<const char*>(data), bytes, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

void spill_read_records(const std::string& path, size_t record_bytes, size_t per_chunk,
                        const std::function<void(const void*, size_t)>& fn) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("spill file {}: cannot open: {}", path, std::strerror(errno));
  std::unique_ptr<int, void (*)(int*)> guard(&fd, [](int* f) { ::close(*f); });
  off_t end = ::lseek(fd, 0, SEEK_END);
  if (end < 0 || uint64_t(end) % record_bytes != 0)
    fail("spill file {}: size {} is not a whole number of {}-byte records", path, int64_t(end),
         record_bytes);
  std::vector<char> buf(per_chunk * record_bytes);
  for (uint64_t off = 0; off < uint64_t(end);) {
    size_t n = size_t(std::min<uint64_t>(buf.size(), uint64_t(end) - off));
    pread_all(fd, buf.data(), n, off, path);
    fn(buf.data(), n / record_bytes);
    off += n;
  }
}

}  // namespace nk::curate
