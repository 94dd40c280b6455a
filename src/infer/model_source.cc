#include "infer/model_source.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "core/json.h"
#include "data/dataset/text_dataset.h"

#include "ckpt/gguf_import.h"
#include "ckpt/model_io.h"
#include "ckpt/model_vocab.h"
#include "ckpt/peft_adapter.h"
#include "core/error.h"
#include "core/log.h"
#include "model/arch.h"
#include "ops/quant.h"

namespace nk {

const char* const kQuantizeKeyDoc =
    "quantise a model folder's weight matrices as it loads: none, w8a16 or w8a8 (int8 per "
    "output channel; w8a8 also quantises activations per token), f16 or bf16 (2 bytes a "
    "weight), q8_0, q4_0, q4_k or q6_k (ggml's block formats); a GGUF file keeps its own "
    "types. Unset, a bf16 model (dtype=bf16) on a CPU without AVX-512 BF16 loads as bf16";

std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& spec,
                                                const std::string& model_dir,
                                                const std::string& key) {
  std::string s = spec;
  if (s.empty()) s = stored_tokenizer(model_dir);
  if (s.empty()) s = "bytes";
  try {
    return load_tokenizer(s);
  } catch (const Error& e) {
    throw e.with_context(key);
  }
}

std::vector<int32_t> generation_end_ids(const std::string& model_dir, const Tokenizer& tok,
                                        int64_t vocab) {
  const std::string path = model_dir + "/generation_config.json";
  if (!std::filesystem::is_regular_file(path)) return {};
  const nlohmann::json j = parse_json_object(read_text_file(path), path);
  const auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return {};
  const nlohmann::json ids = it->is_array() ? *it : nlohmann::json::array({*it});
  std::vector<int32_t> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id =
        int32_t(json_int(ids[i], path, fmt::format("eos_token_id[{}]", i), 0, vocab - 1));
    if (id != tok.eod_id() && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  return out;
}

std::string tokenizer_source(const std::string& spec, const std::string& model_dir,
                             const std::string& key) {
  if (!spec.empty()) return fmt::format("{} '{}'", key, spec);
  const std::string stored = model_dir.empty() ? "" : stored_tokenizer(model_dir);
  if (!stored.empty()) return fmt::format("the tokenizer saved with the model, '{}'", stored);
  return "the bytes tokenizer, the default when the model has none";
}

namespace {

// The model's and tokenizer's vocabularies agree (ckpt/model_vocab.h).
void check_vocab(int64_t model_vocab, const Tokenizer& tok, const ModelSourceKeys& k,
                 const std::string& tok_source) {
  const std::string model_source =
      fmt::format("{} '{}'", is_gguf_path(k.model) ? "GGUF file" : "model folder", k.model);
  try {
    check_model_vocab(model_vocab, model_source, tok.vocab_size(), tok_source);
  } catch (const Error& e) {
    throw e.with_context(k.prefix + ".model");
  }
}

void log_split(const std::string& P, const nn::TensorParallel& tp, const Transformer& m) {
  if (tp.active())
    NK_INFO("{}: the model split over {} tensor-parallel ranks, {} of its {} values on each", P,
            tp.size(), m.layout().total(), m.global_layout().total());
}

}  // namespace

bool bf16_rows_by_default(const ModelSourceKeys& k, DType compute, ops::CpuIsa isa) {
  return k.quantize.empty() && compute == DType::BF16 && isa < ops::CpuIsa::Avx512Bf16 &&
         k.device == kHost && k.adapter.empty() && !is_gguf_path(k.model);
}

void check_tensor_parallel_source(const ModelSourceKeys& k, int64_t tp) {
  if (tp <= 1) return;
  const std::string& P = k.prefix;
  if (k.device != kHost)
    fail("{}.tp = {}: not supported yet with {}.device={} ({}.tp runs on the CPU)", P, tp, P,
         device_name(k.device), P);
  ModelConfig cfg;
  std::unique_ptr<GgufFile> gguf;
  try {
    if (is_gguf_path(k.model)) gguf = GgufFile::open(k.model);
    cfg = gguf ? gguf_model_config(*gguf) : read_model_config(k.model);
  } catch (const Error& e) {
    throw e.with_context(P + ".model");
  }
  try {
    check_tensor_parallel(cfg, tp);
  } catch (const Error& e) {
    fail("{}.tp = {}: {}", P, tp, e.what());
  }
  if (gguf) {  // each rank its share of the file's blocks
    try {
      check_gguf_tensor_parallel(*gguf, k.model, tp);
    } catch (const Error& e) {
      throw e.with_context(P + ".model");
    }
  }
  // Each rank quantises its share of the weights as it loads them (a GGUF
  // file's types are its own: PREFIX.quantize is refused there on load).
  if (!k.quantize.empty() && k.quantize != "none" && !gguf) {
    try {
      quant_plan_for(cfg, ops::parse_quant_type(k.quantize), tp);
    } catch (const Error& e) {
      throw e.with_context(P + ".quantize");
    }
  }
  if (k.adapter.empty()) return;
  // The adapter split as training under tensor parallelism splits it
  // (check_model_pieces: what that cannot split is refused there too).
  PeftAdapterInfo info;
  try {
    info = read_peft_adapter_config(k.adapter, cfg);
  } catch (const Error& e) {
    throw e.with_context(P + ".adapter");
  }
  if (const std::string why = adapters_unsplittable(adapted_config(cfg, info), tp); !why.empty())
    fail(
        "{}.tp = {} with {}.adapter '{}' ({}): {}; merge a LoRA or IA3 adapter into the model "
        "(nekton export hf --adapter) or run one process",
        P, tp, P, k.adapter, info.type, why);
}

RunnableModel load_runnable_model(const ModelSourceKeys& k, const nn::TensorParallel& tp) {
  const std::string& P = k.prefix;
  if (k.model.empty()) fail("{}.model: no model given ({}.model=DIR or FILE.gguf)", P, P);
  const DType compute = parse_dtype(k.dtype);
  // The type the weight matrices take as they load, if any: PREFIX.quantize,
  // or bf16 rows by default (model_source.h).
  const ops::CpuIsa isa = ops::active_cpu_isa();
  // (Not for a tensor-parallel rank's pieces, which are read dense.)
  const bool bf16_rows = bf16_rows_by_default(k, compute, isa) && !tp.active();
  std::optional<ops::QuantType> qtype;
  if (bf16_rows) {
    qtype = ops::QuantType::BF16;
  } else if (!k.quantize.empty() && k.quantize != "none") {
    try {
      qtype = ops::parse_quant_type(k.quantize);
    } catch (const Error& e) {
      throw e.with_context(P + ".quantize");
    }
  }
  const bool quantize = qtype.has_value();
  check_tensor_parallel_source(k, tp.size());
  if (k.device != kHost) {
    const char* why = is_gguf_path(k.model) ? "a GGUF file's block-quantised weights"
                      : quantize            ? "quantised weights"
                      : !k.adapter.empty()  ? "attaching an adapter"
                                            : nullptr;
    if (why)
      fail("{}.device: {} run on the CPU only; {}.device=cuda takes a dense model folder", P, why,
           P);
  }
  RunnableModel r;
  if (is_gguf_path(k.model)) {
    if (quantize)
      fail(
          "{}.quantize: '{}' is a GGUF file, whose tensors keep their own types; quantise it "
          "with `nekton quantize` instead",
          P, k.model);
    if (!k.adapter.empty())
      fail("{}.adapter: adapters apply to model folders, not to a GGUF file ('{}')", P, k.model);
    GgufLoadOptions opt;
    opt.compute = compute;
    opt.allow_nonfinite = k.allow_nonfinite;
    opt.tp = tp;
    GgufModel g;
    try {
      g = load_gguf_model(k.model, opt);
    } catch (const Error& e) {
      throw e.with_context(P + ".model");
    }
    r.model = std::move(g.model);
    r.model->pack_quant_weights();  // for this device's decode kernels (ops::quant_pack)
    log_split(P, tp, *r.model);
    r.gguf = true;
    r.gguf_chat_template = g.chat_template;
    r.name = g.name;
    if (!k.tokenizer.empty()) {
      r.tokenizer = load_model_tokenizer(k.tokenizer, "", P + ".tokenizer");
    } else if (g.tokenizer) {
      r.tokenizer = std::move(g.tokenizer);
    } else {
      fail("{}.model: GGUF '{}' has no tokenizer (tokenizer.ggml.*): name one with {}.tokenizer", P,
           k.model, P);
    }
    check_vocab(r.model->config().vocab_size, *r.tokenizer, k,
                k.tokenizer.empty() ? "the GGUF's tokenizer.ggml.*"
                                    : tokenizer_source(k.tokenizer, "", P + ".tokenizer"));
    return r;
  }
  r.tokenizer = load_model_tokenizer(k.tokenizer, k.model, P + ".tokenizer");
  r.name = model_folder_name(k.model);
  // Before the weights are read: a mismatch fails at once.
  const ModelConfig cfg = read_model_config(k.model);
  const int64_t vocab = cfg.vocab_size;
  check_vocab(vocab, *r.tokenizer, k, tokenizer_source(k.tokenizer, k.model, P + ".tokenizer"));
  r.end_ids = generation_end_ids(k.model, *r.tokenizer, vocab);
  if (quantize) {
    if (!k.adapter.empty())
      fail("{}.adapter: an adapter over a model quantised with {}.quantize is not supported", P, P);
    QuantPlan plan;
    try {
      plan = quant_plan_for(cfg, *qtype, tp.size());
    } catch (const Error& e) {
      throw e.with_context(P + ".quantize");
    }
    if (bf16_rows)
      NK_INFO(
          "{}: the weight matrices are held as bf16 rows ({}.quantize=bf16): this CPU's kernels "
          "({}) have no bf16 dot product, and dense bf16 products would widen every weight to "
          "f32 at each call; {}.quantize=none keeps them dense",
          P, P, ops::cpu_isa_name(isa), P);
    std::vector<std::string> all;
    const ParamLayout layout = model_layout(cfg);
    for (const ParamInfo& p : layout.params()) all.push_back(p.name);
    r.model = std::make_unique<Transformer>(cfg, compute, 0, ParamInit::Zeros, all, kHost,
                                            FrozenWeights::Quantized, plan, tp);
    if (tp.active())  // each rank its slices, quantised as they load
      load_weight_pieces(
          *r.model, k.model, r.model->global_layout(), [](const ParamInfo&) { return true; },
          k.allow_nonfinite);
    else
      load_weights(*r.model, k.model, false, k.allow_nonfinite);
    r.model->pack_quant_weights();
    log_split(P, tp, *r.model);
    return r;
  }
  r.model = load_model(k.model, compute, k.allow_nonfinite, k.device, tp);
  log_split(P, tp, *r.model);
  if (!k.adapter.empty()) {
    try {
      r.model = attach_peft_adapter(*r.model, k.adapter);
    } catch (const Error& e) {
      throw e.with_context(P + ".adapter");
    }
  }
  return r;
}

}  // namespace nk
