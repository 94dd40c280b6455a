// Helpers the Hugging Face import and export share (internal to ckpt/):
// reading small files, output folders built aside and renamed into place, the
// HF weights of a folder (one file or shards + index), tensor transposes and
// conversions, and where a Nekton parameter (or a fused part of it) lives in
// an external checkpoint.
#pragma once
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/output_lock.h"
#include "model/arch.h"

namespace nk::hf {

namespace fs = std::filesystem;

// Tokenizer files an HF folder may hold, copied as they are both ways (with
// chat_template.jinja, where newer transformers keep the chat template).
inline constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json",        "tokenizer.model",         "vocab.json",        "merges.txt",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja"};

std::string read_text(const fs::path& path, const std::string& what);
nlohmann::json parse_json_file(const fs::path& path, const std::string& what);
// "OUT/" and "OUT/." name the folder OUT.
fs::path clean_dir(const std::string& dir);
void copy_one(const fs::path& from, const fs::path& to);

const char* torch_dtype_name(DType t);  // "float32", ...; nk::Error for non-weight dtypes
bool is_weight_dtype(DType t);          // f32, bf16, f16
const char* short_dtype(DType t);       // Nekton's names, as recorded in hf.json

// The config.json export writes for `c` with weights stored as `dtype`.
nlohmann::ordered_json config_object(const ModelConfig& c, DType dtype);

// The shape `e` has in the external checkpoint, given its Nekton parameter.
Shape external_shape(const ParamInfo& p, const ExternalTensor& e);
// The rows of `param` (a tensor shaped like p) that `e` covers: a view.
Tensor external_rows(const Tensor& param, const ParamInfo& p, const ExternalTensor& e);
// A 2-d tensor of any float dtype -> its transpose in `dtype`.
Tensor transposed(const Tensor& t, DType dtype);
// t in `dtype` (t itself when it already is).
Tensor converted(const Tensor& t, DType dtype);

// An HF folder's weights: model.safetensors, or the shards an index names.
// nk::Error naming the folder, index or shard when one is missing or wrong.
class HfWeights {
 public:
  explicit HfWeights(const fs::path& dir);
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  const SafetensorsFile& file(const std::string& name) const { return files_[where_.at(name)]; }
  const SafetensorsEntry& entry(const std::string& name) const { return file(name).entry(name); }
  Tensor get(const std::string& name) const { return file(name).get(name); }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> names() const;

 private:
  void add_file(const fs::path& path);
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;
};

// OUT_DIR is built as a sibling temporary and renamed into place on commit();
// destroyed uncommitted, the temporary is removed and OUT_DIR is untouched.
// OUT_DIR.lock is held meanwhile, and what a killed export left is removed.
class StagedDir {
 public:
  StagedDir(const fs::path& final_dir, bool overwrite, const fs::path& input);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;
  const fs::path& path() const { return tmp_; }
  void commit();

 private:
  std::optional<OutputLock> lock_;  // taken first, released last
  fs::path final_, tmp_;
  bool done_ = false;
};

}  // namespace nk::hf
