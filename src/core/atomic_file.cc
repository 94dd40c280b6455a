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

void install_folder(const std::string& tmp, const std::string& final_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(final_dir, ec)) {
    fs::rename(tmp, final_dir, ec);
    if (ec) fail("cannot move '{}' into place as '{}': {}", tmp, final_dir, ec.message());
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ec);  // now holds the replaced folder
    return;
  }
  const std::string old = temporary_path(final_dir + ".old");
  fs::rename(final_dir, old, ec);
  if (!ec) fs::rename(tmp, final_dir, ec);
  if (ec) fail("cannot move '{}' into place as '{}': {}", tmp, final_dir, ec.message());
  fs::remove_all(old, ec);
}

int remove_stale_temporaries_of(const std::string& path, bool within) {
  namespace fs = std::filesystem;
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "out/" names out
  const std::string base = p.filename().string();
  // PATH.tmp.<pid> is a temporary name whose stem is exactly PATH's name.
  auto of_path = [&](const std::string& name) {
    if (!is_temporary_name(name)) return false;
    std::string stem = name.substr(0, name.rfind(".tmp."));
    return stem == base || stem == base + ".old";
  };
  std::vector<fs::path> stale;
  std::error_code ec;
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (of_path(e.path().filename().string())) stale.push_back(e.path());
  if (within && fs::is_directory(p, ec)) {
    for (auto it = fs::recursive_directory_iterator(p, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (!is_temporary_name(it->path().filename().string())) continue;
      stale.push_back(it->path());
      it.disable_recursion_pending();  // removed whole
    }
  }
  int removed = 0;
  for (const fs::path& s : stale) {
    std::error_code rec;
    if (fs::remove_all(s, rec) > 0 && !rec) ++removed;
  }
  return removed;
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  AtomicFileWriter w(path);
  w.write(contents.data(), contents.size());
  w.commit();
}

}  // namespace nk
