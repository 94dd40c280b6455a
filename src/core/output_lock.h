// One run per output at a time. A run holds an exclusive flock(2) on a lock
// file for as long as it writes: OUT/.nekton.lock inside a folder it keeps
// (train, curate), or PATH.lock beside a file, a file prefix (preprocess's
// PREFIX.bin/.idx) or a folder that is replaced whole (export). A second run
// fails at once with the holder's pid. The kernel drops the lock when its
// holder dies, kill -9 included, so a stale lock file never blocks a rerun;
// and only while holding it may a run remove the temporaries a killed writer
// left (remove_stale_temporaries_of), since a live writer's look the same.
#pragma once
#include <string>

namespace nk {

enum class LockAt {
  Inside,  // OUTPUT/.nekton.lock (OUTPUT is created; removed again if the run leaves it empty)
  Beside,  // OUTPUT.lock
};

class OutputLock {
 public:
  // nk::Error "'OUTPUT' is in use by nekton pid N (lock file ...)" when
  // another process (or another OutputLock in this one) holds it.
  OutputLock(const std::string& output, LockAt at);
  ~OutputLock();  // unlocks and removes the lock file
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  const std::string& file() const { return file_; }
  static std::string lock_file(const std::string& output, LockAt at);

 private:
  std::string file_;
  std::string created_;  // the folder this lock created, removed again if left empty
  int fd_ = -1;
};

}  // namespace nk
