#include "ckpt/hf_files.h"

#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/json.h"
#include "ops/ops.h"

namespace nk::hf {

using nlohmann::json;

std::string read_text(const fs::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read {}", what, path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("{}: cannot read {}", what, path.string());
  return ss.str();
}

json parse_json_file(const fs::path& path, const std::string& what) {
  return parse_json(read_text(path, what), path.string());
}

fs::path clean_dir(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  while (!p.empty() && !p.has_filename() && p.has_parent_path() && p != p.root_path())
    p = p.parent_path();
  return p;
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    default:
      fail("dtype {} cannot store weights (use f32, bf16 or f16)", dtype_name(t));
  }
}

bool is_weight_dtype(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

// Nekton's short dtype names, as recorded in hf.json.
const char* short_dtype(DType t) {
  return t == DType::BF16 ? "bf16" : t == DType::F16 ? "f16" : "f32";
}

void copy_one(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) fail("cannot copy '{}' to '{}': {}", from.string(), to.string(), ec.message());
}

Shape external_shape(const ParamInfo& p, const ExternalTensor& e) {
  Shape s = p.shape;
  if (!e.part.empty()) s[0] = p.part(e.part).rows;
  if (e.transposed) std::reverse(s.begin(), s.end());
  return s;
}

Tensor external_rows(const Tensor& param, const ParamInfo& p, const ExternalTensor& e) {
  if (e.part.empty()) return param;
  const ParamPart& q = p.part(e.part);
  return param.narrow0(q.row0, q.rows);
}

// A 2-d tensor of any float dtype -> its transpose in `dtype`.
Tensor transposed(const Tensor& t, DType dtype) {
  const int64_t R = t.dim(0), Cc = t.dim(1);
  std::vector<float> a(size_t(R * Cc)), b(a.size());
  ops::copy_to_host(t, a.data());
  constexpr int64_t kB = 64;  // tiles keep both sides in cache
  for (int64_t i0 = 0; i0 < R; i0 += kB)
    for (int64_t j0 = 0; j0 < Cc; j0 += kB)
      for (int64_t i = i0; i < std::min(R, i0 + kB); ++i)
        for (int64_t j = j0; j < std::min(Cc, j0 + kB); ++j)
          b[size_t(j * R + i)] = a[size_t(i * Cc + j)];
  Tensor out = Tensor::empty({Cc, R}, dtype);
  ops::copy_from_host(out, b.data());
  return out;
}

Tensor converted(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype);
  ops::convert(out, t);
  return out;
}

HfWeights::HfWeights(const fs::path& dir) {
  fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (fs::exists(single)) {
    add_file(single);
    return;
  }
  if (!fs::exists(index)) {
    for (const char* other : {"pytorch_model.bin", "pytorch_model.bin.index.json"})
      if (fs::exists(dir / other))
        fail(
            "'{}': only safetensors weights can be imported, found {} (convert it with "
            "save_pretrained(..., safe_serialization=True))",
            dir.string(), other);
    fail("'{}': no model.safetensors or model.safetensors.index.json", dir.string());
  }
  json j = parse_json_file(index, "index");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail("{}: missing object 'weight_map'", index.string());
  std::map<std::string, std::string> placed;  // tensor -> file, as the index says
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string())
      fail("{}: weight_map entry for '{}' is not a file name", index.string(), tensor);
    std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      fail("{}: weight_map entry for '{}' names '{}', not a file in the folder", index.string(),
           tensor, f);
    placed[tensor] = f;
  }
  std::set<std::string> shard_names;
  for (const auto& [tensor, f] : placed) shard_names.insert(f);
  for (const std::string& f : shard_names) {
    if (!fs::exists(dir / f)) {
      std::string example;
      for (const auto& [tensor, g] : placed)
        if (g == f) {
          example = tensor;
          break;
        }
      fail("{}: shard '{}' (holding '{}' and others) is missing", index.string(),
           (dir / f).string(), example);
    }
    add_file(dir / f);
  }
  for (const auto& [tensor, f] : placed) {
    auto it = where_.find(tensor);
    if (it == where_.end() || files_[it->second].path() != (dir / f).string())
      fail("{}: the index places tensor '{}' in '{}', which has no tensor of that name",
           index.string(), tensor, f);
  }
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> n;
  for (const auto& [name, i] : where_) n.push_back(name);
  return n;
}

void HfWeights::add_file(const fs::path& path) {
  files_.push_back(SafetensorsFile::open(path.string()));
  for (const SafetensorsEntry& e : files_.back().entries()) {
    auto [it, fresh] = where_.emplace(e.name, files_.size() - 1);
    if (!fresh)
      fail("tensor '{}' is in both '{}' and '{}'", e.name, files_[it->second].path(),
           path.string());
  }
}

StagedDir::StagedDir(const fs::path& final_dir, bool overwrite, const fs::path& input)
    : final_(final_dir) {
  std::error_code ec;
  if (final_.empty()) fail("output folder name is empty");
  if (final_.has_parent_path()) fs::create_directories(final_.parent_path(), ec);
  lock_.emplace(final_.string(), LockAt::Beside);
  if (fs::exists(final_)) {
    if (!fs::is_directory(final_)) fail("output '{}' exists and is not a folder", final_.string());
    if (fs::equivalent(final_, input, ec))
      fail("output '{}' is the input folder; choose another", final_.string());
    if (!fs::is_empty(final_) && !overwrite)
      fail("output '{}' already exists and is not empty (--overwrite replaces it)",
           final_.string());
  }
  remove_stale_temporaries_of(final_.string());
  tmp_ = temporary_path(final_.string());
  if (!fs::create_directories(tmp_, ec) && ec)
    fail("cannot create '{}': {}", tmp_.string(), ec.message());
}
StagedDir::~StagedDir() {
  if (!done_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

void StagedDir::commit() {
  install_folder(tmp_.string(), final_.string());
  done_ = true;
}

}  // namespace nk::hf
