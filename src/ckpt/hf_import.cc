// nekton import hf: a Hugging Face folder -> a Nekton model folder.
#include <algorithm>
#include <set>

#include "ckpt/hf_files.h"
#include "ckpt/hf_io.h"
#include "ckpt/model_io.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/tokenizer/tokenizer.h"
#include "ops/ops.h"

namespace nk {

using namespace hf;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// Non-parameter buffers old HF checkpoints carry: causal masks of GPT-2
// (h.L.attn.bias, h.L.attn.masked_bias) and Llama's rotary inv_freq.
bool is_ignored_buffer(const std::string& name) {
  auto ends = [&](const char* s) { return name.ends_with(s); };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends(".rotary_emb.inv_freq");
}

}  // namespace

bool is_hf_model_folder(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!fs::exists(path)) return false;
  const nlohmann::json j = nlohmann::json::parse(hf::read_text(path, "config"), nullptr, false);
  return j.is_object() && j.contains("architectures") && !j.contains("arch");
}

ModelConfig any_model_folder_config(const std::string& dir) {
  if (!is_hf_model_folder(dir)) return read_model_config(dir);
  const std::string path = dir + "/config.json";
  return hf_model_info_from_json(hf::read_text(path, "config"), path).config;
}

HfImportReport import_hf(const std::string& hf_dir, const std::string& out_dir,
                         const HfImportOptions& opt) {
  if (!is_weight_dtype(opt.storage))
    fail("import: --dtype {} cannot store weights (use f32, bf16 or f16)", dtype_name(opt.storage));
  fs::path src = clean_dir(hf_dir);
  if (!fs::is_directory(src)) fail("'{}' is not a folder", hf_dir);
  fs::path cfg_path = src / "config.json";
  if (!fs::exists(cfg_path)) fail("'{}': no config.json", hf_dir);
  std::string cfg_text = read_text(cfg_path, "config");
  HfModelInfo info = hf_model_info_from_json(cfg_text, cfg_path.string());
  const ModelConfig& cfg = info.config;

  HfWeights w(src);
  std::vector<std::string> present = w.names();
  const Architecture& arch = cfg.architecture();
  const std::string arch_name = arch.display_name();
  std::string prefix = arch.hf_tensor_prefix();
  if (!prefix.empty() && std::none_of(present.begin(), present.end(),
                                      [&](const std::string& n) { return n.starts_with(prefix); }))
    prefix = "";
  const std::vector<ExternalTensor> map = hf_model_tensors(cfg, prefix);
  const ParamLayout layout = model_layout(cfg);

  // Check every tensor before reading any.
  std::set<std::string> expected;
  std::set<DType> dtypes;
  auto check = [&](const std::string& name, const Shape& shape) {
    expected.insert(name);
    if (!w.has(name))
      fail("'{}': missing tensor '{}' (a {} model per config.json)", hf_dir, name, arch_name);
    const SafetensorsEntry& e = w.entry(name);
    const std::string& file = w.file(name).path();
    if (!is_weight_dtype(e.dtype))
      fail("{}: tensor '{}' has dtype {}, expected F32, BF16 or F16", file, name,
           safetensors_dtype_name(e.dtype));
    if (e.shape != shape)
      fail("{}: tensor '{}' has shape {}, config.json needs {}", file, name, shape_str(e.shape),
           shape_str(shape));
    dtypes.insert(e.dtype);
  };
  for (const ExternalTensor& e : map) check(e.name, external_shape(layout.find(e.param), e));
  bool tied_copy = cfg.tied_embeddings && w.has("lm_head.weight");
  if (tied_copy) check("lm_head.weight", {cfg.vocab_size, cfg.d_model});
  int64_t skipped = 0;
  for (const std::string& name : present) {
    if (expected.count(name) || is_ignored_buffer(name)) continue;
    if (arch.hf_skipped_tensor(cfg, name)) {
      ++skipped;
      continue;
    }
    fail("{}: unexpected tensor '{}' (not part of a {} model with this config.json)",
         w.file(name).path(), name, arch_name);
  }
  if (skipped > 0)
    NK_INFO("'{}': left out {} tensors of {}'s multi-token-prediction layers (not run by Nekton)",
            hf_dir, skipped, arch_name);

  // Parameters in the order the map first names them, each assembled from its
  // external tensors (one, or one per fused part).
  std::vector<std::pair<std::string, Tensor>> tensors;
  int64_t n_params = 0;
  if (opt.progress) {
    double total = 0;
    for (const ExternalTensor& e : map)
      total += double(w.entry(e.name).end - w.entry(e.name).begin);
    opt.progress->start(total, "B");
  }
  for (size_t i = 0; i < map.size();) {
    const ParamInfo& p = layout.find(map[i].param);
    Tensor dst = Tensor::empty(p.shape, DType::F32);
    for (; i < map.size() && map[i].param == p.name; ++i) {
      const ExternalTensor& e = map[i];
      Tensor t = w.get(e.name);
      check_finite(t, w.file(e.name).path(), e.name, opt.allow_nonfinite);
      Tensor rows = external_rows(dst, p, e);
      if (e.transposed)
        ops::convert(rows, transposed(t, DType::F32));
      else
        ops::convert(rows, t);
      if (opt.progress) opt.progress->advance(double(w.entry(e.name).end - w.entry(e.name).begin));
    }
    n_params += dst.numel();
    tensors.emplace_back(p.name, converted(dst, opt.storage));
  }
  if (tied_copy) {
    const std::string& emb = map[0].name;
    std::vector<float> a(size_t(cfg.vocab_size * cfg.d_model)), b(a.size());
    ops::copy_to_host(w.get(emb), a.data());
    ops::copy_to_host(w.get("lm_head.weight"), b.data());
    if (a != b)
      fail(
          "{}: 'lm_head.weight' differs from '{}' but config.json has tie_word_embeddings = "
          "true",
          w.file("lm_head.weight").path(), emb);
  }

  HfImportReport rep;
  rep.config = cfg;
  rep.architecture = info.architecture;
  rep.n_params = n_params;
  for (const SafetensorsFile& f : w.files()) rep.weight_files.push_back(f.path());
  rep.source_dtype = dtypes.size() == 1 ? short_dtype(*dtypes.begin()) : "mixed";

  if (opt.progress) opt.progress->finish();
  StagedDir out(clean_dir(out_dir), opt.overwrite, src);
  save_safetensors((out.path() / "model.safetensors").string(), tensors, {{"format", "nekton"}});
  tensors.clear();
  write_file_atomic((out.path() / "config.json").string(), model_config_to_json(cfg));
  ojson meta;
  meta["format"] = "nekton-hf-import";
  meta["source"] = fs::absolute(src).string();
  meta["architecture"] = info.architecture;
  meta["dtype"] = rep.source_dtype;
  meta["tensor_prefix"] = prefix;
  meta["config"] = ojson::parse(cfg_text);
  write_file_atomic((out.path() / "hf.json").string(), meta.dump(2) + "\n");
  // generation_config.json: its eos_token_id list ends generation (a chat
  // model's end-of-turn tokens); kept as it is, for export too.
  if (fs::is_regular_file(src / "generation_config.json"))
    copy_one(src / "generation_config.json", out.path() / "generation_config.json");

  // Tokenizer files: staged in a folder of their own, then kept with the model
  // by store_tokenizer when Nekton can open them, else copied as they are.
  fs::path stage = out.path() / ".hf_tokenizer";
  for (const char* name : kTokenizerFiles)
    if (fs::exists(src / name)) {
      fs::create_directories(stage);
      copy_one(src / name, stage / name);
      rep.tokenizer_files.push_back(name);
    }
  if (!rep.tokenizer_files.empty()) {
    bool loadable = false;
    try {
      load_tokenizer(stage.string());
      loadable = true;
    } catch (const Error&) {
    }
    if (loadable) {
      store_tokenizer(stage.string(), out.path().string());
      rep.tokenizer_spec = "./tokenizer";
      fs::remove_all(stage);
    } else {
      fs::rename(stage, out.path() / "tokenizer");
    }
  }
  out.commit();
  return rep;
}

}  // namespace nk
