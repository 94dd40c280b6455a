// Hugging Face safetensors: an 8-byte little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {..}},
// then the raw little-endian tensor bytes; offsets count from the byte after
// the header. Every field is validated on open, so a corrupt or truncated file
// is an nk::Error naming the file (and tensor), never a crash.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/tensor.h"
#include "nn/param_layout.h"

namespace nk {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  size_t begin, end;  // bytes, relative to the start of the data buffer
};

// "F32", "BF16", ...; nk::Error for names Nekton cannot hold.
const char* safetensors_dtype_name(DType t);

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);  // reads & validates the header

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in data order
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // nk::Error if missing
  Tensor get(const std::string& name) const;                     // CPU copy in the file's dtype
  // Reads tensor `name` into `dst` (contiguous, same dtype and element count;
  // straight from the file on the CPU, through a host copy on a device);
  // nk::Error naming the file and tensor otherwise.
  void read_into(const std::string& name, const Tensor& dst) const;
  // Reads only `ranges` of tensor `name` (a tensor-parallel rank's slices of
  // it, nn/param_layout.h's shard_ranges; dim 0 or, for a 2-d tensor, dim 1)
  // into `dst`, laid out as the shard: contiguous, the file's dtype (a device
  // tensor through a host copy).
  void read_slices_into(const std::string& name, const std::vector<SliceRange>& ranges,
                        const Tensor& dst) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  struct Fd;  // keeps the file open, so get() reads the version that was validated
  std::string path_;
  std::shared_ptr<Fd> fd_;
  size_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes atomically (see AtomicFileWriter); tensors must be contiguous (a
// device tensor is copied to the host one at a time), and their data is laid
// out in the given order.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace nk
