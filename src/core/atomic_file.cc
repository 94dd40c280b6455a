#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace nk {

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path), tmp_(temporary_path(path)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot write '{}': {}", path_, std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  abort();
}

void AtomicFileWriter::abort() noexcept {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  NK_CHECK(fd_ >= 0, "write to '{}' after commit", path_);
  const char* p = static_cast<const char*>(data);
  if (buf_.size() + bytes <= kBufferBytes) {
    buf_.insert(buf_.end(), p, p + bytes);
    return;
  }
  flush();
  if (bytes >= kBufferBytes) return write_through(p, bytes);
  buf_.assign(p, p + bytes);
}

void AtomicFileWriter::flush() {
  write_through(buf_.data(), buf_.size());
  buf_.clear();
}

void AtomicFileWriter::write_through(const char* p, size_t bytes) {
  while (bytes > 0) {
    // Linux caps one write at ~2 GiB; larger tensors go in several calls.
    ssize_t n = ::write(fd_, p, std::min<size_t>(bytes, size_t(1) << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      abort();
      fail("cannot write '{}': {}", path_, std::strerror(err));
    }
    p += n;
    bytes -= size_t(n);
  }
}

void AtomicFileWriter::commit() {
  NK_CHECK(fd_ >= 0, "commit of '{}' twice", path_);
  flush();
  int err = ::fsync(fd_) != 0 ? errno : 0;
  if (::close(fd_) != 0 && err == 0) err = errno;
  fd_ = -1;
  if (err != 0) {
    ::unlink(tmp_.c_str());
    fail("cannot write '{}': {}", path_, std::strerror(err));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    err = errno;
    ::unlink(tmp_.c_str());
    fail("cannot replace '{}': {}", path_, std::strerror(err));
  }
  // Persist the rename itself; best effort, the data is already durable.
  std::string dir = std::filesystem::path(path_).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string temporary_path(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

bool is_temporary_name(const std::string& filename) {
  size_t at = filename.rfind(".tmp.");
  if (at == std::string::npos || at + 5 == filename.size()) return false;
  return std::all_of(filename.begin() + long(at + 5), filename.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  AtomicFileWriter w(path);
  w.write(contents.data(), contents.size());
  w.commit();
}

}  // namespace nk
