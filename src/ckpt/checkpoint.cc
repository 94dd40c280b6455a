#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ckpt/load_progress.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json.h"
#include "core/limits.h"
#include "core/log.h"
#include "ops/ops.h"

namespace nk {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kTmpPrefix = ".tmp.";      // a save in progress (or killed)
constexpr const char* kTrashPrefix = ".trash.";  // a checkpoint being removed

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open folder '{}': {}", dir.string(), std::strerror(errno));
  int err = ::fsync(fd) != 0 ? errno : 0;
  ::close(fd);
  if (err != 0 && err != EINVAL)  // some file systems cannot sync folders
    fail("cannot sync folder '{}': {}", dir.string(), std::strerror(err));
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// Renames `dir` to a hidden trash name first, so a kill in the middle of the
// removal never leaves a half-deleted step_N that looks like a checkpoint.
void remove_checkpoint_dir(const fs::path& dir) {
  fs::path trash = dir.parent_path() / (std::string(kTrashPrefix) + dir.filename().string() + "." +
                                        std::to_string(::getpid()));
  std::error_code ec;
  fs::rename(dir, trash, ec);
  if (ec) {
    NK_WARN("cannot remove old checkpoint '{}': {}", dir.string(), ec.message());
    return;
  }
  fs::remove_all(trash, ec);
}

ojson slice_json(const Shape& shape) {
  // The whole tensor, held by rank 0 of 1; a sharded save records its own part.
  return {{"global_shape", shape}, {"offsets", Shape(shape.size(), 0)}, {"shape", shape}};
}

// A parameter's split, fused parts and the ranges rank 0 of 1 holds.
ojson param_json(const ParamInfo& p) {
  ojson j = {{"split", split_name(p.split)}};
  if (!p.parts.empty()) {
    ojson parts = ojson::array();
    for (const ParamPart& q : p.parts) parts.push_back({{"name", q.name}, {"rows", q.rows}});
    j["parts"] = parts;
  }
  ojson ranges = ojson::array();
  for (const SliceRange& r : shard_ranges(p, 0, 1))
    ranges.push_back(
        {{"dim", r.dim}, {"start", r.start}, {"len", r.len}, {"local", r.local_start}});
  j["ranges"] = ranges;
  return j;
}

ojson slices_json(const std::vector<std::pair<std::string, Tensor>>& tensors,
                  const std::map<std::string, const ParamInfo*>& params) {
  ojson j = ojson::object();
  for (const auto& [name, t] : tensors) {
    j[name] = slice_json(t.shape());
    if (auto it = params.find(name); it != params.end()) {
      const ojson extra = param_json(*it->second);
      for (auto& [k, v] : extra.items()) j[name][k] = v;
    }
  }
  return j;
}

// Swaps a finished folder into place as `final_dir`. An existing final_dir is
// exchanged atomically (Linux renameat2), so step_N is always one complete
// checkpoint; where the file system cannot exchange, the old one is moved
// aside first (a kill in between leaves only the older checkpoints).
void install_dir(const fs::path& tmp, const fs::path& final_dir) {
  if (!fs::exists(final_dir)) {
    fs::rename(tmp, final_dir);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // now holds the replaced checkpoint
    return;
  }
  remove_checkpoint_dir(final_dir);
  fs::rename(tmp, final_dir);
}

std::string read_small_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

void remove_stale_temporaries(const std::string& root) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::string name = e.path().filename().string();
    if (starts_with(name, kTmpPrefix) || starts_with(name, kTrashPrefix)) {
      std::error_code ec2;
      fs::remove_all(e.path(), ec2);
    }
  }
  remove_stale_temporaries_of((fs::path(root) / "latest").string());  // write_file_atomic's
}

std::string checkpoint_name(int64_t step) {
  return fmt::format("step_{:08d}", step);
}

int64_t checkpoint_step(const std::string& dir) {
  std::string name = fs::path(dir).filename().string();
  if (!starts_with(name, "step_") || name.size() < 13 || name.size() > 23) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string file_checksum(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot read '{}': {}", path, std::strerror(errno));
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> st(XXH3_createState(), XXH3_freeState);
  XXH3_64bits_reset(st.get());
  std::vector<char> buf(size_t(4) << 20);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      fail("cannot read '{}': {}", path, std::strerror(err));
    }
    if (n == 0) break;
    XXH3_64bits_update(st.get(), buf.data(), size_t(n));
  }
  ::close(fd);
  return fmt::format("{:016x}", XXH3_64bits_digest(st.get()));
}

std::vector<std::pair<std::string, Tensor>> flat_tensors(const ParamLayout& layout,
                                                         const Tensor& flat,
                                                         const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const ParamInfo& p : layout.params())
    out.emplace_back(prefix + p.name, ParamLayout::view(flat, p));
  return out;
}

void describe_flat_tensors(CheckpointContents& c, const ParamLayout& layout,
                           const std::string& prefix) {
  for (const ParamInfo& p : layout.params()) c.params[prefix + p.name] = &p;
}

std::string checkpoint_shard_file(const std::string& stem, int64_t rank, int64_t world) {
  return fmt::format("{}.{:05d}-of-{:05d}.safetensors", stem, rank, world);
}

std::string shared_checkpoint_tmp(const std::string& root, int64_t step, int64_t token) {
  return (fs::path(root) / (kTmpPrefix + checkpoint_name(step) + "." + std::to_string(token)))
      .string();
}

void prepare_shared_checkpoint(const std::string& root, const std::string& tmp) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) fail("cannot create checkpoint folder '{}': {}", root, ec.message());
  remove_stale_temporaries(root);
  fs::create_directories(tmp, ec);
  if (ec) fail("cannot create '{}': {}", tmp, ec.message());
}

namespace {

ojson file_record(const fs::path& path) {
  return {{"bytes", fs::file_size(path)}, {"xxh3_64", file_checksum(path.string())}};
}

std::map<std::string, std::string> with_format(std::map<std::string, std::string> meta,
                                               int64_t step) {
  meta["format"] = "nekton-checkpoint";
  meta["step"] = std::to_string(step);
  return meta;
}

}  // namespace

std::string write_checkpoint_shard(const std::string& tmp, const CheckpointShard& shard) {
  NK_CHECK(shard.file.find('/') == std::string::npos && shard.file != kManifest &&
               shard.file != kModelFile && shard.file != kOptimizerFile,
           "write_checkpoint_shard: bad file name '{}'", shard.file);
  const fs::path path = fs::path(tmp) / shard.file;
  ojson tensors = ojson::object();
  for (const auto& [name, t] : shard.tensors) {
    auto it = shard.pieces.find(name);
    NK_CHECK(
        it != shard.pieces.end() && t.ndim() == 1 && t.numel() == it->second.end - it->second.begin,
        "write_checkpoint_shard: tensor '{}' {} does not match its piece", name, t.desc());
    tensors[name] = {{"global_shape", it->second.global_shape},
                     {"flat_range", {it->second.begin, it->second.end}},
                     {"shape", t.shape()}};
  }
  try {
    // The step is in the manifest; the file's own metadata names the format.
    save_safetensors(path.string(), shard.tensors, shard.metadata);
    ojson record = {{"file", shard.file}, {"info", file_record(path)}, {"tensors", tensors}};
    return record.dump();
  } catch (const fs::filesystem_error& e) {
    fail("saving checkpoint shard '{}': {}", path.string(), e.what());
  }
}

std::string finish_shared_checkpoint(const std::string& root_str, const std::string& tmp_str,
                                     const CheckpointContents& c,
                                     const std::vector<std::string>& records, int64_t keep) {
  NK_CHECK(keep >= 1, "save_checkpoint: keep must be >= 1, got {}", keep);
  const fs::path root(root_str), tmp(tmp_str);
  const std::string name = checkpoint_name(c.step);
  const fs::path final_dir = root / name;
  // Shard files are named "<kind>.RRRRR-of-NNNNN.safetensors".
  std::vector<ojson> parsed;
  bool model_sharded = false;
  for (const std::string& text : records) {
    parsed.push_back(ojson::parse(text));
    model_sharded |= starts_with(parsed.back().at("file").get<std::string>(), "model.");
  }
  const bool sharded = !records.empty();
  std::error_code ec;
  try {
    if (!model_sharded)
      save_safetensors((tmp / kModelFile).string(), c.model, with_format({}, c.step));
    if (!sharded)
      save_safetensors((tmp / kOptimizerFile).string(), c.optimizer,
                       with_format(c.optimizer_metadata, c.step));
    for (const auto& [file, text] : c.text_files) {
      NK_CHECK(file != kManifest && file != kModelFile && file != kOptimizerFile &&
                   file.find('/') == std::string::npos,
               "save_checkpoint: bad file name '{}'", file);
      write_file_atomic((tmp / file).string(), text);
    }

    ojson files = ojson::object();
    std::vector<std::string> names;
    if (!model_sharded) names.push_back(kModelFile);
    if (!sharded) names.push_back(kOptimizerFile);
    for (const auto& [file, text] : c.text_files) names.push_back(file);
    for (const std::string& f : names) files[f] = file_record(tmp / f);
    ojson tensors = ojson::object();
    if (!model_sharded) tensors[kModelFile] = slices_json(c.model, c.params);
    if (!sharded) tensors[kOptimizerFile] = slices_json(c.optimizer, c.params);
    ojson shard_files = ojson::array(), model_files = ojson::array();
    for (const ojson& r : parsed) {
      const std::string f = r.at("file").get<std::string>();
      NK_CHECK(!files.contains(f), "save_checkpoint: two ranks wrote '{}'", f);
      files[f] = r.at("info");
      tensors[f] = r.at("tensors");
      (starts_with(f, "model.") ? model_files : shard_files).push_back(f);
    }
    ojson manifest = {{"format", "nekton-checkpoint"},
                      {"version", 1},
                      {"step", c.step},
                      {"rank", 0},
                      {"world_size", sharded ? int64_t(shard_files.size()) : int64_t(1)},
                      {"files", files},
                      {"tensors", tensors}};
    if (sharded) manifest["optimizer_shards"] = shard_files;
    if (model_sharded) manifest["model_shards"] = model_files;
    // The manifest comes last: a folder without one is an unfinished save.
    write_file_atomic((tmp / kManifest).string(), manifest.dump(1) + "\n");
    fsync_dir(tmp);
    install_dir(tmp, final_dir);
    fsync_dir(root);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    fail("saving checkpoint '{}': {}", final_dir.string(), e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  write_file_atomic((root / "latest").string(), name + "\n");

  std::vector<std::string> all = list_checkpoints(root_str);
  for (size_t i = size_t(keep); i < all.size(); ++i) remove_checkpoint_dir(all[i]);
  return final_dir.string();
}

std::string save_checkpoint(const std::string& root, const CheckpointContents& c, int64_t keep) {
  NK_CHECK(keep >= 1, "save_checkpoint: keep must be >= 1, got {}", keep);
  const std::string tmp = shared_checkpoint_tmp(root, c.step, ::getpid());
  prepare_shared_checkpoint(root, tmp);
  return finish_shared_checkpoint(root, tmp, c, {}, keep);
}

std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    int64_t step = checkpoint_step(e.path().string());
    if (step >= 0 && e.is_directory(ec)) found.emplace_back(step, e.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> out;
  for (auto& [step, dir] : found) out.push_back(std::move(dir));
  return out;
}

std::string read_latest_pointer(const std::string& root) {
  std::ifstream in(fs::path(root) / "latest");
  std::string name;
  if (!(in >> name)) return "";
  return name;
}

CheckpointReader CheckpointReader::open(const std::string& dir) {
  CheckpointReader r;
  r.dir_ = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("checkpoint '{}': not a folder", dir);
  const std::string mpath = (fs::path(dir) / kManifest).string();
  if (!fs::exists(mpath, ec))
    fail("checkpoint '{}': {} is missing (an unfinished save?)", dir, mpath);
  ojson m;
  try {
    m = ojson::parse(read_small_file(mpath));
  } catch (const ojson::exception& e) {
    fail("checkpoint '{}': {} is not valid JSON: {}", dir, mpath, e.what());
  }
  try {
    if (m.value("format", "") != "nekton-checkpoint")
      fail("checkpoint '{}': {} is not a Nekton checkpoint manifest", dir, mpath);
    if (json_int(m.at("version"), mpath, "version") != 1)
      fail("checkpoint '{}': {} has unknown version {}", dir, mpath, m.at("version").dump());
    r.step_ = json_int(m.at("step"), mpath, "step", 0, limits::kSteps);
    r.world_ = json_int(m.at("world_size"), mpath, "world_size", 1, INT32_MAX);
    std::set<std::string> shard_files, model_files;
    if (m.contains("optimizer_shards"))
      for (const auto& f : m.at("optimizer_shards")) shard_files.insert(f.get<std::string>());
    if (m.contains("model_shards"))
      for (const auto& f : m.at("model_shards")) model_files.insert(f.get<std::string>());
    if (r.world_ < 1 || (r.world_ != 1 && int64_t(shard_files.size()) != r.world_) ||
        (!model_files.empty() && int64_t(model_files.size()) != r.world_))
      fail("checkpoint '{}': {} says world_size {} but lists {} optimizer and {} model shards", dir,
           mpath, r.world_, shard_files.size(), model_files.size());
    for (const auto& [file, slices] : m.at("tensors").items()) {
      const bool shard = shard_files.count(file) > 0 || model_files.count(file) > 0;
      Shard info{file, {}};
      for (const auto& [tensor, s] : slices.items()) {
        if (!shard) {
          if (s.at("shape") != s.at("global_shape"))
            fail("checkpoint '{}': {} holds only a slice of tensor '{}'", dir, file, tensor);
          continue;
        }
        const std::string key = "tensors." + file + "." + tensor;
        FlatPiece p{json_shape(s.at("global_shape"), mpath, key + ".global_shape"),
                    json_int(s.at("flat_range").at(0), mpath, key + ".flat_range"),
                    json_int(s.at("flat_range").at(1), mpath, key + ".flat_range")};
        if (p.begin < 0 || p.begin > p.end || p.end > shape_numel(p.global_shape) ||
            s.at("shape") != Shape{p.end - p.begin})
          fail("checkpoint '{}': {} records a bad piece [{}, {}) of tensor '{}' {}", dir, mpath,
               p.begin, p.end, tensor, shape_str(p.global_shape));
        info.pieces[tensor] = std::move(p);
      }
      if (model_files.count(file))
        r.model_shards_.push_back(std::move(info));
      else if (shard)
        r.optimizer_shards_.push_back(std::move(info));
    }
    const ojson& files = m.at("files");
    if (model_files.empty() && !files.contains(kModelFile))
      fail("checkpoint '{}': {} lists no {}", dir, mpath, kModelFile);
    if (shard_files.empty() && !files.contains(kOptimizerFile))
      fail("checkpoint '{}': {} lists no {}", dir, mpath, kOptimizerFile);
    for (const auto* set : {&shard_files, &model_files})
      for (const std::string& f : *set)
        if (!files.contains(f)) fail("checkpoint '{}': {} lists no {}", dir, mpath, f);
    for (const auto& [file, info] : files.items()) {
      std::string path = (fs::path(dir) / file).string();
      if (file.find('/') != std::string::npos || file == kManifest)
        fail("checkpoint '{}': {} lists a bad file name '{}'", dir, mpath, file);
      if (!fs::is_regular_file(path, ec)) fail("checkpoint '{}': file {} is missing", dir, path);
      uint64_t want = uint64_t(json_int(info.at("bytes"), mpath, "files." + file + ".bytes", 0)),
               have = fs::file_size(path, ec);
      if (have != want)
        fail("checkpoint '{}': file {} is {} bytes, the manifest records {} (truncated?)", dir,
             path, have, want);
      std::string sum = file_checksum(path), want_sum = info.at("xxh3_64").get<std::string>();
      if (sum != want_sum)
        fail("checkpoint '{}': file {} fails its checksum (xxh3_64 {}, manifest {}): corrupt", dir,
             path, sum, want_sum);
    }
  } catch (const ojson::exception& e) {
    fail("checkpoint '{}': {} has a missing or invalid field: {}", dir, mpath, e.what());
  }
  int64_t named = checkpoint_step(dir);
  if (named >= 0 && named != r.step_)
    fail("checkpoint '{}': the manifest says step {}, the folder name step {}", dir, r.step_,
         named);
  return r;
}

std::string CheckpointReader::path(const std::string& file) const {
  return (fs::path(dir_) / file).string();
}

std::string CheckpointReader::text(const std::string& file) const {
  std::string p = path(file);
  if (!fs::exists(p)) fail("checkpoint '{}': file {} is missing", dir_, p);
  return read_small_file(p);
}

std::string find_latest_checkpoint(const std::string& root) {
  std::vector<std::string> all = list_checkpoints(root);
  std::string first_error;
  for (const std::string& dir : all) {
    try {
      CheckpointReader::open(dir);
      if (!first_error.empty())
        NK_WARN("falling back to the older checkpoint {} (the newer ones are unusable)", dir);
      return dir;
    } catch (const Error& e) {
      NK_WARN("skipping checkpoint {}: {}", dir, e.what());
      if (first_error.empty()) first_error = e.what();
    }
  }
  if (!all.empty())
    fail("no usable checkpoint in '{}' ({} found, none verifies); the newest failed with: {}", root,
         all.size(), first_error);
  return "";
}

std::string recover_checkpoint_root(const std::string& root) {
  remove_stale_temporaries(root);
  std::string dir = find_latest_checkpoint(root);
  if (dir.empty()) return dir;
  std::string name = fs::path(dir).filename().string();
  if (read_latest_pointer(root) != name)
    write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
  return dir;
}

namespace {

// Every `prefix + name` tensor of `layout` present in `file` as F32 of its
// shape, and no other `prefix` tensors there.
void check_flat_tensors(const SafetensorsFile& file, const ParamLayout& layout,
                        const std::string& prefix) {
  std::set<std::string> wanted;
  for (const ParamInfo& p : layout.params()) {
    std::string name = prefix + p.name;
    wanted.insert(name);
    if (!file.has(name))
      fail("{}: tensor '{}' is missing (the checkpoint is of another model?)", file.path(), name);
    const SafetensorsEntry& e = file.entry(name);
    if (e.shape != p.shape)
      fail("{}: tensor '{}' has shape {} in the checkpoint, but this model's is {}", file.path(),
           name, shape_str(e.shape), shape_str(p.shape));
    // bf16: AdamW moments saved as optim.moment_dtype=bf16 holds them.
    if (e.dtype != DType::F32 && e.dtype != DType::BF16)
      fail("{}: tensor '{}' is {}, expected F32 or BF16", file.path(), name, dtype_name(e.dtype));
  }
  for (const SafetensorsEntry& e : file.entries())
    if (starts_with(e.name, prefix.c_str()) && !wanted.count(e.name))
      fail(
          "{}: tensor '{}' (shape {}) is not part of this model (the checkpoint is of another "
          "model?)",
          file.path(), e.name, shape_str(e.shape));
}

}  // namespace

namespace {

double ckpt_tensor_read_bytes(const SafetensorsFile& file, const ParamInfo& p,
                              const std::string& prefix) {
  const std::string name = prefix + p.name;
  if (!file.has(name)) return 0;
  const SafetensorsEntry& e = file.entry(name);
  const double whole = double(std::max<int64_t>(1, shape_numel(e.shape)));
  return double(e.end - e.begin) * std::min(1.0, double(p.numel()) / whole);
}

}  // namespace

double flat_tensor_read_bytes(const SafetensorsFile& file, const ParamLayout& local,
                              const std::string& prefix) {
  double total = 0;
  for (const ParamInfo& p : local.params()) total += ckpt_tensor_read_bytes(file, p, prefix);
  return total;
}

void read_flat_tensors(const SafetensorsFile& file, const ParamLayout& layout,
                       const std::string& prefix, Tensor& flat, LoadProgress* progress) {
  NK_CHECK(flat.dtype() == DType::F32 && flat.numel() == layout.total(),
           "read_flat_tensors: flat buffer {} does not match the layout", flat.desc());
  check_flat_tensors(file, layout, prefix);
  for (const ParamInfo& p : layout.params()) {
    const std::string name = prefix + p.name;
    const DType stored = file.entry(name).dtype;
    if (progress) progress->advance(ckpt_tensor_read_bytes(file, p, prefix));
    if (stored == DType::F32) {
      file.read_into(name, ParamLayout::view(flat, p));
      continue;
    }
    Tensor t = Tensor::empty(p.shape, stored);  // widened exactly into f32
    file.read_into(name, t);
    ops::convert(ParamLayout::view(flat, p), t);
  }
}

void read_flat_tensor_shards(const SafetensorsFile& file, const ParamLayout& layout,
                             const std::string& prefix, const ParamLayout& local, int64_t rank,
                             int64_t n, Tensor& flat, LoadProgress* progress) {
  NK_CHECK(flat.dtype() == DType::F32 && flat.numel() == local.total(),
           "read_flat_tensor_shards: flat buffer {} does not match the layout", flat.desc());
  read_tensor_shards(
      file, layout, prefix, local, rank, n,
      [&](const ParamInfo& p, const Tensor&) { return ParamLayout::view(flat, p); }, progress);
}

void read_tensor_shards(const SafetensorsFile& file, const ParamLayout& layout,
                        const std::string& prefix, const ParamLayout& local, int64_t rank,
                        int64_t n, const ShardTarget& target, LoadProgress* progress) {
  check_flat_tensors(file, layout, prefix);
  Tensor scratch;
  for (const ParamInfo& p : local.params()) {
    // The slices go where `target` says, or through a scratch tensor it is handed.
    Tensor dst = target(p, Tensor());
    const bool direct = dst.defined();
    if (!direct) {
      if (!scratch.defined() || scratch.numel() < p.numel())
        scratch = Tensor::empty({std::max<int64_t>(p.numel(), 1)}, DType::F32);
      dst = scratch.narrow0(0, p.numel()).view(p.shape);
    }
    const std::string name = prefix + p.name;
    const DType stored = file.entry(name).dtype;
    const auto ranges = shard_ranges(tensor_split(layout.find(p.name)), rank, n);
    // A shard ending in vocabulary padding: the slices leave the padding rows zero.
    int64_t held = 0;
    for (const SliceRange& r : ranges) held += r.len;
    const bool padded = ranges.empty() || (ranges[0].dim == 0 && held < p.shape[0]);
    if (progress) progress->advance(ckpt_tensor_read_bytes(file, p, prefix));
    if (stored == DType::F32) {
      if (padded) ops::fill(dst, 0.f);
      file.read_slices_into(name, ranges, dst);
    } else {
      Tensor t = padded ? Tensor::zeros(p.shape, stored) : Tensor::empty(p.shape, stored);
      file.read_slices_into(name, ranges, t);
      ops::convert(dst, t);
    }
    if (!direct) target(p, dst);
  }
}

}  // namespace nk
