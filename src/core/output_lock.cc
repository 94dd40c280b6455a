#include "core/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/log.h"

namespace nk {

namespace {

// The pid a holder wrote into its lock file; "" if not (yet) written.
std::string holder_pid(int fd) {
  char buf[32] = {};
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s(buf, n > 0 ? size_t(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.find_first_not_of("0123456789") == std::string::npos ? s : "";
}

bool same_file(int fd, const std::string& path) {
  struct stat a {
  }, b{};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

}  // namespace

std::string OutputLock::lock_file(const std::string& output, LockAt at) {
  std::string out = output;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return at == LockAt::Inside ? out + "/.nekton.lock" : out + ".lock";
}

OutputLock::OutputLock(const std::string& output, LockAt at) : file_(lock_file(output, at)) {
  namespace fs = std::filesystem;
  for (;;) {
    if (at == LockAt::Inside) {
      std::error_code ec;
      if (fs::create_directories(output, ec)) created_ = output;
      if (ec) fail("cannot create output folder '{}': {}", output, ec.message());
    }
    fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create lock file '{}': {}", file_, std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string pid = err == EWOULDBLOCK ? holder_pid(fd_) : "";
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK)
        fail(
            "'{}' is in use by {} (lock file '{}'); wait for that run to end or choose another "
            "output",
            output, pid.empty() ? std::string("another nekton process") : "nekton pid " + pid,
            file_);
      // Some network file systems have no flock: the run goes on unguarded.
      NK_WARN("cannot lock '{}' ({}); nothing stops two runs writing '{}' at once", file_,
              std::strerror(err), output);
      return;
    }
    // The previous holder removes the file as it lets go; if that happened
    // between our open and flock, we hold a name nobody else will open.
    if (same_file(fd_, file_)) break;
    ::close(fd_);
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size()))
    NK_WARN("cannot record this process in lock file '{}': {}", file_, std::strerror(errno));
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  // Removed while still locked: whoever opened it meanwhile sees it vanish.
  ::unlink(file_.c_str());
  ::close(fd_);
  if (!created_.empty()) ::rmdir(created_.c_str());  // only if the run left it empty
}

}  // namespace nk
