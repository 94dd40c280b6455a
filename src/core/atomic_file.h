// Crash-safe file replacement: write PATH.tmp.<pid>, fsync, rename over PATH.
// A reader sees either the old file or the complete new one, never a prefix;
// a failed write leaves PATH untouched and removes the temporary.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace nk {

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);  // nk::Error if the temp can't be created
  ~AtomicFileWriter();  // not committed: closes and removes the temporary
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Small writes are gathered into one buffer; large ones go straight to the
  // file. nk::Error naming PATH on failure (and the temporary is removed).
  void write(const void* data, size_t bytes);
  void commit();  // flush, fsync, rename over PATH

  const std::string& path() const { return path_; }

 private:
  void abort() noexcept;
  void flush();
  void write_through(const char* p, size_t bytes);
  static constexpr size_t kBufferBytes = size_t(8) << 20;
  std::string path_, tmp_;
  int fd_ = -1;
  std::vector<char> buf_;  // pending bytes, at most kBufferBytes
};

// The name a file or folder is first written under before its rename into
// place: PATH.tmp.<pid>. One convention, so that a rerun after a kill can
// recognise what the killed process left.
std::string temporary_path(const std::string& path);
// True for a name of that form (NAME.tmp.<digits>).
bool is_temporary_name(const std::string& filename);

// Moves the finished folder TMP into place as FINAL_DIR. An existing FINAL_DIR
// is exchanged atomically (Linux renameat2) and then removed, so FINAL_DIR is
// always one complete folder; where the file system cannot exchange, the old
// one is moved aside to temporary_path(FINAL_DIR + ".old") first. A kill in
// between leaves only names remove_stale_temporaries_of(FINAL_DIR) removes.
void install_folder(const std::string& tmp, const std::string& final_dir);

// Removes what killed writers of PATH left beside it: PATH.tmp.<pid> and
// PATH.old.tmp.<pid> (install_folder's), files or folders. With `within`, for
// a folder a run owns whole (curate's or train's output folder), also every
// NAME.tmp.<pid> anywhere inside PATH. A live writer's temporary looks just
// the same, so call it only while holding PATH's OutputLock (core/output_lock.h).
// Returns how many it removed.
int remove_stale_temporaries_of(const std::string& path, bool within = false);

// Whole-file convenience for small files (config.json, tokenizer files).
void write_file_atomic(const std::string& path, const std::string& contents);

}  // namespace nk
