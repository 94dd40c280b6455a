#include "ckpt/gguf_import.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "ckpt/gguf_tokenizer.h"
#include "ckpt/load_progress.h"
#include "ckpt/model_io.h"
#include "core/error.h"
#include "core/limits.h"
#include "core/log.h"
#include "model/arch.h"
#include "model/rope.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace nk {

namespace fs = std::filesystem;

namespace {

// The architecture of general.architecture `ga`: among those that write it,
// the Mixture-of-Experts one when the file has <ga>.expert_count > 0 (a
// Mixtral in llama.cpp's "llama"), else the dense one of that name.
// deepseek2 is DeepSeek-V3's when its gating is sigmoid (expert_gating_func
// 2), else DeepSeek-V2's.
const Architecture& architecture_for(const GgufFile& f, const std::string& ga) {
  const bool moe = f.get_int(ga + ".expert_count", 0) > 0;
  std::string name = ga;
  if (ga == "deepseek2")
    name = f.get_int(ga + ".expert_gating_func", 1) == 2 ? "deepseek_v3" : "deepseek_v2";
  const Architecture* found = nullptr;
  for (const Architecture* a : architectures()) {
    if (a->gguf_arch() != ga || a->moe() != moe) continue;
    if (!found || a->name() == name) found = a;  // "llama" is Llama's, not Mistral's
  }
  if (!found && moe)
    fail(
        "GGUF '{}': {}.expert_count = {}: Nekton has no Mixture-of-Experts model for "
        "general.architecture '{}'",
        f.path(), ga, f.get_int(ga + ".expert_count"), ga);
  if (!found) {
    std::vector<std::string> known;
    for (const Architecture* a : architectures())
      if (!a->gguf_arch().empty() &&
          std::find(known.begin(), known.end(), a->gguf_arch()) == known.end())
        known.push_back(a->gguf_arch());
    fail("GGUF '{}': general.architecture '{}' is not one Nekton loads (known: {})", f.path(), ga,
         fmt::join(known, ", "));
  }
  return *found;
}

int64_t positive(const GgufFile& f, const std::string& key, int64_t limit) {
  const int64_t v = f.get_int(key);
  if (v < 1 || v > limit) fail("GGUF '{}': {} = {} is not in [1, {}]", f.path(), key, v, limit);
  return v;
}

// llama3 RoPE scaling reaches llama.cpp as rope_freqs.weight, per-pair
// divisors f_i of the plain frequencies. Llama 3.1's rule (model/rope.h) makes
// f_i 1 for short wavelengths, `factor` for long ones and, between, 1/f_i =
// (1 - s)/factor + s with s linear in 1/w_i: two pairs in between give the
// line, hence low and high_freq_factor relative to the original context.
// The fitted scaling must give back every f_i (relative 1e-4), or the file
// is refused.
RopeScaling llama3_from_freq_factors(const GgufFile& f, const std::vector<float>& div,
                                     const ModelConfig& c, int64_t original) {
  const std::string what = fmt::format("GGUF '{}': rope_freqs.weight", f.path());
  const int64_t half = c.head_dim() / 2;
  if (int64_t(div.size()) != half)
    fail("{} has {} values for {} rotary pairs", what, div.size(), half);
  const std::vector<double> plain = rope_inv_freq(c.head_dim(), c.rope_theta, {}, c.max_seq_len);
  RopeScaling s;
  s.type = RopeScalingType::Llama3;
  s.factor = *std::max_element(div.begin(), div.end());
  s.original_max_seq_len = original;
  std::vector<std::pair<double, double>> line;  // (1 / wavelength, s)
  for (int64_t i = 0; i < half; ++i) {
    const double fi = div[size_t(i)];
    if (fi > 1 + 1e-6 && fi < s.factor * (1 - 1e-6))
      line.push_back({plain[size_t(i)] / (2 * M_PI), (1 / fi - 1 / s.factor) / (1 - 1 / s.factor)});
  }
  if (s.factor <= 1 + 1e-6 || line.size() < 2)
    fail(
        "{} is not llama3 RoPE scaling that Nekton can recognise ({} pairs between the two "
        "regimes; two are needed)",
        what, line.size());
  // s = a / w + b with a = L / (hf - lf), b = -lf / (hf - lf).
  const auto [x0, y0] = line.front();
  const auto [x1, y1] = line.back();
  const double a = (y1 - y0) / (x1 - x0), b = y0 - a * x0;
  s.low_freq_factor = -b / a * double(original);
  s.high_freq_factor = (1 - b) / a * double(original);
  const std::vector<double> scaled = rope_inv_freq(c.head_dim(), c.rope_theta, s, c.max_seq_len);
  for (int64_t i = 0; i < half; ++i) {
    const double want = div[size_t(i)], got = plain[size_t(i)] / scaled[size_t(i)];
    if (std::fabs(got - want) > 1e-4 * want)
      fail(
          "{}: pair {} has divisor {}, but the llama3 scaling fitted to the file (factor {}, "
          "low_freq_factor {}, high_freq_factor {}) gives {}",
          what, i, want, s.factor, s.low_freq_factor, s.high_freq_factor, got);
  }
  return s;
}

void read_rope_scaling(const GgufFile& f, const std::string& ga, ModelConfig& c) {
  const std::string k = ga + ".rope.scaling.";
  const std::string type = f.get_string(k + "type", "none");
  const int64_t original = f.get_int(k + "original_context_length", c.max_seq_len);
  if (type == "linear") {
    c.rope_scaling.type = RopeScalingType::Linear;
    c.rope_scaling.factor = f.get_float(k + "factor");
  } else if (type == "yarn") {
    c.rope_scaling.type = RopeScalingType::Yarn;
    c.rope_scaling.factor = f.get_float(k + "factor");
    c.rope_scaling.original_max_seq_len = original;
  } else if (type != "none") {
    fail("GGUF '{}': {}type '{}' is not supported (none, linear, yarn)", f.path(), k, type);
  }
  if (const GgufFile::TensorInfo* t = f.find("rope_freqs.weight")) {
    if (type != "none")
      fail("GGUF '{}': rope_freqs.weight together with {}type '{}'", f.path(), k, type);
    if (t->type != uint32_t(GgmlType::F32))
      fail("GGUF '{}': rope_freqs.weight is {}, expected f32", f.path(),
           ggml_type_number_name(t->type));
    std::vector<float> div(t->bytes / 4);
    std::memcpy(div.data(), t->data, t->bytes);
    c.rope_scaling = llama3_from_freq_factors(f, div, c, original);
  }
  // LongRoPE (Phi-3's, as llama.cpp's converter writes it): the per-pair
  // divisors as rope_factors_long / rope_factors_short, the attention factor
  // and the original context as keys; the factor is the context over it.
  const GgufFile::TensorInfo* lf = f.find("rope_factors_long.weight");
  const GgufFile::TensorInfo* sf = f.find("rope_factors_short.weight");
  if (lf || sf) {
    if (!lf || !sf || type != "none" || f.find("rope_freqs.weight"))
      fail(
          "GGUF '{}': rope_factors_long.weight and rope_factors_short.weight go together, "
          "without {}type or rope_freqs.weight",
          f.path(), k);
    RopeScaling s;
    s.type = RopeScalingType::LongRope;
    s.original_max_seq_len = original;
    s.factor = double(c.max_seq_len) / double(original);
    // The file's attention factor, unless it is the default for the factor
    // (as Nekton's export writes it; kept unset then, so the model reads back
    // as it was).
    const double attn = f.get_float(k + "attn_factor", 0.0);
    if (attn > 0 && std::fabs(attn - rope_attention_factor(s)) > 1e-6 * attn)
      s.attention_factor = attn;
    for (const auto& [t, list] : {std::pair{lf, &s.long_factor}, std::pair{sf, &s.short_factor}}) {
      if (t->type != uint32_t(GgmlType::F32) || t->shape.size() != 1)
        fail("GGUF '{}': {} must be a 1-d f32 tensor", f.path(), t->name);
      std::vector<float> v(size_t(t->shape[0]));
      std::memcpy(v.data(), t->data, v.size() * 4);
      list->assign(v.begin(), v.end());
      if (int64_t(v.size()) * 2 != c.head_dim())
        fail("GGUF '{}': {} has {} factors; heads of {} have {} pairs", f.path(), t->name, v.size(),
             c.head_dim(), c.head_dim() / 2);
    }
    c.rope_scaling = s;
  }
  c.rope_scaling.validate("GGUF " + k);
}

// Rows of one tensor of the file and where they go in a Nekton parameter
// (a stacked expert tensor gives one piece per expert, from file row
// file_row0 on).
struct Piece {
  const GgufFile::TensorInfo* t;
  int64_t row0, rows;
  int64_t rope_heads;
  int64_t file_row0 = 0;
  float add = 0;  // the file holds value + add (ExternalTensor::add: Gemma's 1 + w norms)
  // The piece's rows are the columns of the file's rows [file_row0,
  // file_row0 + in), each `rows` values (a slice of MLA's attn_k_b).
  bool transposed = false;
  // File rows read.
  int64_t file_rows() const { return transposed ? t->shape[t->shape.size() - 2] : rows; }
};

// The file bytes a piece reads: its rows' share of its tensor's (all dims
// but the last are rows; a 1-d tensor is one row).
double gguf_piece_bytes(const Piece& p) {
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < p.t->shape.size(); ++d) rows *= p.t->shape[d];
  return double(p.t->bytes) * double(p.file_rows()) / double(std::max<int64_t>(1, rows));
}

// Row r of the parameter's piece comes from file row src_row(r): the inverse
// of permute_rope_rows (the exporter moved old row h D + s D/2 + j to h D + 2j + s).
int64_t src_row(const Piece& p, int64_t r) {
  if (p.rope_heads == 0) return p.file_row0 + r;
  const int64_t D = p.rows / p.rope_heads, half = D / 2;
  const int64_t h = r / D, rem = r % D, s = rem / half, j = rem % half;
  return p.file_row0 + h * D + 2 * j + s;
}

// Rank `rank` of n's share of parameter g (the whole model's entry) from its
// pieces into `runs` (quant_share_runs' runs of it): raw bytes, q/k rows moved
// back, nothing requantised. A row-split share takes the whole rows of its
// ranges; a column-split one each row's blocks of its columns.
void copy_quant_share(const ParamInfo& g, const std::vector<Piece>& ps,
                      std::vector<ops::QuantWeight>& runs, int64_t rank, int64_t n) {
  // The file row holding row r of g (ps sorted by row0; a MoE tensor has a
  // piece per expert, so found by bisection).
  auto file_row = [&](int64_t r) -> std::pair<const Piece*, int64_t> {
    auto it = std::upper_bound(ps.begin(), ps.end(), r,
                               [](int64_t row, const Piece& pc) { return row < pc.row0; });
    NK_CHECK(it != ps.begin() && r < std::prev(it)->row0 + std::prev(it)->rows,
             "copy_quant_share: row {} of '{}' is in no piece", r, g.name);
    const Piece& pc = *std::prev(it);
    return {&pc, src_row(pc, r - pc.row0)};
  };
  // Row `local` of the share: its run (a few per parameter) and the row in it.
  auto local_row = [&](int64_t local) -> std::pair<ops::QuantWeight*, int64_t> {
    for (ops::QuantWeight& q : runs) {
      if (local < q.rows()) return {&q, local};
      local -= q.rows();
    }
    NK_CHECK(false, "copy_quant_share: row {} past '{}''s runs", local, g.name);
    return {nullptr, 0};
  };
  for (const SliceRange& r : shard_ranges(tensor_split(g), rank, n)) {
    const bool rows = r.dim == 0;
    for (int64_t i = 0; i < (rows ? r.len : g.shape[0]); ++i) {
      const auto [pc, src] = file_row(rows ? r.start + i : i);
      const auto [q, at] = local_row(rows ? r.local_start + i : i);
      auto* dst = static_cast<uint8_t*>(q->data.raw()) + size_t(at) * q->row_bytes();
      const uint8_t* from = pc->t->data + size_t(src) * ops::quant_row_bytes(q->type, g.shape[1]);
      if (rows) {
        std::memcpy(dst, from, q->row_bytes());
      } else {  // (whole blocks: quant_share_runs)
        const size_t per = ops::quant_row_bytes(q->type, ops::quant_block(q->type));
        const size_t skip = size_t(r.start / ops::quant_block(q->type)) * per;
        std::memcpy(dst + size_t(r.local_start / ops::quant_block(q->type)) * per, from + skip,
                    size_t(r.len / ops::quant_block(q->type)) * per);
      }
    }
  }
}

// Block formats and F16 matrices are kept as they are (F16 at its 2 bytes,
// read by the products as W8A16's int8 is); F32 and BF16 load dense.
bool kept(GgmlType t) {
  return ggml_is_quantized(t) || t == GgmlType::F16;
}

// The piece's values in f32, q and k rows put back (dst: p.rows x in; a
// 1-d piece is one row of p.rows values).
void decode_rows(const Piece& p, int64_t in, float* dst) {
  if (p.t->shape.size() == 1) return gguf_decode_rows(*p.t, 0, 1, dst);
  if (p.transposed) {
    std::vector<float> cols(size_t(in * p.rows));  // [in, rows]
    gguf_decode_rows(*p.t, p.file_row0, in, cols.data());
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t i = 0; i < in; ++i) dst[r * in + i] = cols[size_t(i * p.rows + r)];
    return;
  }
  if (p.rope_heads == 0) return gguf_decode_rows(*p.t, p.file_row0, p.rows, dst);  // one call
  for (int64_t r = 0; r < p.rows; ++r) gguf_decode_rows(*p.t, src_row(p, r), 1, dst + r * in);
}

std::string lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// DeepSeek-V3's routing from the metadata, as llama.cpp reads it
// (Architecture::gguf_deepseek_routing); the score bias where the first MoE
// layer has exp_probs_b.bias.
void read_deepseek_routing(const GgufFile& f, const std::string& k, ModelConfig& c) {
  c.moe_first_dense_layers = f.get_int(k + "leading_dense_block_count", 0);
  if (c.moe_first_dense_layers < 0 || c.moe_first_dense_layers >= c.n_layer)
    fail("GGUF '{}': {}leading_dense_block_count = {} is not in [0, {})", f.path(), k,
         c.moe_first_dense_layers, c.n_layer);
  c.moe_shared_d_ff = f.get_int(k + "expert_shared_count", 0) * c.moe_d_ff;
  c.moe_shared_expert_gate = false;
  const int64_t gating = f.get_int(k + "expert_gating_func", 1);
  if (gating != 1 && gating != 2)
    fail("GGUF '{}': {}expert_gating_func = {} is not supported (1 softmax, 2 sigmoid)", f.path(),
         k, gating);
  c.moe_score_func = gating == 2 ? "sigmoid" : "softmax";
  c.norm_topk_prob = f.get_bool(k + "expert_weights_norm", false);
  const double scale = f.get_float(k + "expert_weights_scale", 0.0);
  c.moe_routed_scaling = scale == 0.0 ? 1.0 : scale;  // llama.cpp: 0 and 1 leave the weights
  c.moe_n_group = f.get_int(k + "expert_group_count", 1);
  c.moe_topk_group = f.get_int(k + "expert_group_used_count", 1);
  c.moe_score_bias =
      f.find(fmt::format("blk.{}.exp_probs_b.bias", c.moe_first_dense_layers)) != nullptr;
}

// Whether a deepseek2 file holds kv_b split per head (attn_k_b, attn_v_b):
// as llama.cpp decides (is_mla), by attention.key_length_mla and
// value_length_mla. ExternalTensor::KvB.
bool gguf_split_kv_b(const GgufFile& f, const std::string& k) {
  return f.has(k + "attention.key_length_mla") || f.has(k + "attention.value_length_mla");
}

// The architecture's tensors in this file's layout: deepseek2's kv_b split
// or whole (gguf_split_kv_b), as llama.cpp reads it; a file holding both
// has the other one's tensors left unread (and named in a warning).
std::vector<ExternalTensor> gguf_file_tensors(const GgufFile& f, const Architecture& arch,
                                              const ModelConfig& c) {
  const ExternalTensor::KvB skip = gguf_split_kv_b(f, arch.gguf_arch() + ".")
                                       ? ExternalTensor::KvB::Unsplit
                                       : ExternalTensor::KvB::Split;
  std::vector<ExternalTensor> out;
  for (ExternalTensor& e : arch.gguf_tensors(c))
    if (e.kv_b != skip) out.push_back(std::move(e));
  return out;
}

// Multi-head Latent Attention as llama.cpp's deepseek2 reads it (and
// ckpt/gguf_export.cc add_latent_attention writes it): the ranks (a file
// with attn_q has no query bottleneck, whatever attention.q_lora_rank
// says), the rotated part rope.dimension_count, and each head's key and
// value sizes: with kv_b split per head (attn_k_b, attn_v_b; llama.cpp's
// absorbed path), attention.key_length_mla (qk_nope + qk_rope) and
// value_length_mla, key_length and value_length being then the latent
// row's (kv_rank + rope, kv_rank); with the older unsplit attn_kv_b,
// key_length and value_length. Every head has its own key (head_count_kv
// is not read: converters write 1 or head_count).
void read_latent_attention(const GgufFile& f, const std::string& k, ModelConfig& c) {
  const bool split = gguf_split_kv_b(f, k);
  // The other layout's tensors alone: a file llama.cpp would not load either.
  const char* want = split ? "blk.0.attn_k_b.weight" : "blk.0.attn_kv_b.weight";
  const char* other = split ? "blk.0.attn_kv_b.weight" : "blk.0.attn_k_b.weight";
  if (!f.find(want) && f.find(other))
    fail(
        "GGUF '{}': tensor '{}' without '{}': the file has {}{}attention.key_length_mla, with "
        "which llama.cpp reads kv_b split (attn_k_b, attn_v_b), without it whole (attn_kv_b)",
        f.path(), other, want, split ? "" : "no ", k);
  c.n_kv_head = c.n_head;
  c.kv_lora_rank = positive(f, k + "attention.kv_lora_rank", limits::kHidden);
  c.q_lora_rank =
      f.find("blk.0.attn_q.weight") ? 0 : positive(f, k + "attention.q_lora_rank", limits::kHidden);
  const std::string key = k + (split ? "attention.key_length_mla" : "attention.key_length");
  const std::string value = k + (split ? "attention.value_length_mla" : "attention.value_length");
  c.attn_head_dim = positive(f, key, limits::kHidden);
  c.v_head_dim = positive(f, value, limits::kHidden);
  c.qk_rope_head_dim = positive(f, k + "rope.dimension_count", c.attn_head_dim);
  if (!split) return;
  // llama.cpp sizes its cache's one head by these: the latent row.
  for (const auto& [name, v] :
       {std::pair{"attention.key_length", c.kv_lora_rank + c.qk_rope_head_dim},
        std::pair{"attention.value_length", c.kv_lora_rank}})
    if (f.has(k + name) && f.get_int(k + name) != v)
      fail(
          "GGUF '{}': {}{} = {}; with attention.key_length_mla it is the latent row's size, {} "
          "(kv_lora_rank {}{})",
          f.path(), k, name, f.get_int(k + name), v, c.kv_lora_rank,
          std::string(name) == "attention.key_length"
              ? fmt::format(" + rope.dimension_count {}", c.qk_rope_head_dim)
              : "");
}

// DeepSeek's yarn: llama.cpp scales the scores by (1 + yarn_log_multiplier
// ln factor)^2 and leaves cos/sin unscaled, i.e. mscale = mscale_all_dim =
// yarn_log_multiplier / 0.1 (as export writes it).
void read_latent_yarn(const GgufFile& f, const std::string& k, ModelConfig& c) {
  if (c.rope_scaling.type != RopeScalingType::Yarn) return;
  const std::string key = k + "rope.scaling.yarn_log_multiplier";
  // The f32 key's shortest decimal (0.0707 for an exported mscale of 0.707),
  // not its binary value: the scale the file was written from.
  const double m = std::stod(fmt::format("{}", float(f.get_float(key, 0.0))));
  if (!(m > 0))
    fail(
        "GGUF '{}': {}rope.scaling.type yarn without {} > 0: Nekton reads DeepSeek's yarn as "
        "llama.cpp's deepseek2 runs it, with the scores' mscale",
        f.path(), k, key);
  c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim = m / 0.1;
}

// llama.cpp's gemma2 and gemma3 graphs, as ckpt/gguf_export.cc add_gemma
// writes them: what the graph fixes rather than reads comes from the
// architecture (the attention scale 1/sqrt(head size), or of hidden / heads
// at the 27B's layer count; gemma2's local layers alternating from layer 0;
// gemma3's five local layers then a global one, their RoPE base 10000,
// unscaled), the window and gemma2's soft-capping from the keys. The head is
// the embedding (an output.weight is not read, as llama.cpp does not).
void read_gemma(const GgufFile& f, const std::string& ga, ModelConfig& c) {
  const bool g3 = ga == "gemma3";
  const std::string k = ga + ".";
  const int64_t big = g3 ? 62 : 46;
  c.query_pre_attn_scalar = double(c.n_layer == big ? c.d_model / c.n_head : c.head_dim());
  c.sliding_window = positive(f, k + "attention.sliding_window", limits::kSeqLen);
  c.tied_embeddings = true;
  if (g3) {
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
      if (f.has(k + key) && f.get_float(k + key) != 0)
        fail(
            "GGUF '{}': {}{} = {}: Nekton runs gemma3 as llama.cpp's graph does, without "
            "soft-capping",
            f.path(), k, key, f.get_float(k + key));
    c.sliding_window_pattern = 6;
    c.rope_local_theta = 10000.0;
    return;
  }
  c.sliding_window_pattern = 2;
  // llama.cpp's defaults when a key is absent: Gemma 2's published caps.
  c.attn_logit_softcap = f.get_float(k + "attn_logit_softcapping", 50.0);
  c.final_logit_softcap = f.get_float(k + "final_logit_softcapping", 30.0);
}

}  // namespace

bool is_gguf_path(const std::string& path) {
  const std::string ext = lower(fs::path(path).extension().string());
  return ext == ".gguf";
}

ModelConfig gguf_model_config(const GgufFile& f) {
  const std::string ga = f.get_string("general.architecture");
  const Architecture& arch = architecture_for(f, ga);
  ModelConfig c;
  c.arch = arch.name();
  const std::string k = ga + ".";
  c.n_layer = positive(f, k + "block_count", limits::kLayers);
  c.d_model = positive(f, k + "embedding_length", limits::kHidden);
  c.d_ff = positive(f, k + "feed_forward_length", limits::kFfn);
  c.n_head = positive(f, k + "attention.head_count", limits::kHeads);
  c.n_kv_head = f.has(k + "attention.head_count_kv")
                    ? positive(f, k + "attention.head_count_kv", limits::kHeads)
                    : c.n_head;
  c.max_seq_len = positive(f, k + "context_length", limits::kSeqLen);
  // The keys follow the block, as in export: the epsilon under its norm's
  // key, rotary settings only for rotary positions.
  const BlockSpec spec = arch.block();  // qk_norm: set below where optional
  const bool rotary = !spec.learned_positions;
  c.norm_eps = f.get_float(k + gguf_norm_eps_key(spec), 1e-5);
  if (rotary) c.rope_theta = f.get_float(k + "rope.freq_base", 10000.0);
  // A head size apart from embedding_length / head_count (Qwen3's) comes
  // as attention.key_length (and value_length, which must equal it).
  if (spec.latent_attention) {
    read_latent_attention(f, k, c);
  } else {
    if (f.has(k + "attention.key_length")) {
      const int64_t d = positive(f, k + "attention.key_length", limits::kHidden);
      if (c.d_model % c.n_head || d != c.d_model / c.n_head) c.attn_head_dim = d;
    }
    if (c.attn_head_dim == 0 && c.d_model % c.n_head)
      fail("GGUF '{}': {}attention.head_count = {} does not divide {}embedding_length = {}",
           f.path(), k, c.n_head, k, c.d_model);
    if (rotary && c.head_dim() % 2 != 0)
      fail(
          "GGUF '{}': head size {} ({}attention.key_length, or embedding_length / head_count) is "
          "odd; rotary embeddings need an even one",
          f.path(), c.head_dim(), k);
    if (f.has(k + "attention.value_length") &&
        f.get_int(k + "attention.value_length") != c.head_dim())
      fail("GGUF '{}': {}attention.value_length = {}; Nekton needs the head size {}", f.path(), k,
           f.get_int(k + "attention.value_length"), c.head_dim());
    // Fewer rotated values than the head has: partial rotary (GLM-4.5's half).
    if (rotary && f.has(k + "rope.dimension_count")) {
      const int64_t r = f.get_int(k + "rope.dimension_count");
      if (r < 2 || r % 2 || r > c.head_dim())
        fail(
            "GGUF '{}': {}rope.dimension_count = {}; Nekton needs an even count in [2, the head "
            "size {}]",
            f.path(), k, r, c.head_dim());
      if (r != c.head_dim()) c.partial_rotary_factor = double(r) / double(c.head_dim());
    }
  }
  // q/k norms where the architecture makes them optional: as the file has them.
  if (arch.optional_qk_norm()) c.qk_norm = f.find("blk.0.attn_q_norm.weight") != nullptr;
  // Multi-token-prediction layers (GLM-4.5's nextn_predict_layers) come
  // after the model's own in block_count; llama.cpp's graph skips them, and
  // so does Nekton.
  if (const int64_t mtp = f.get_int(k + "nextn_predict_layers", 0); mtp > 0) {
    if (mtp >= c.n_layer)
      fail("GGUF '{}': {}nextn_predict_layers = {} leaves no layer of {}block_count = {}", f.path(),
           k, mtp, k, c.n_layer);
    c.n_layer -= mtp;
    NK_INFO("GGUF '{}': skipping the {} multi-token-prediction layer(s) after layer {}", f.path(),
            mtp, c.n_layer - 1);
  }
  const bool gemma = ga == "gemma2" || ga == "gemma3";
  if (!gemma && f.has(k + "attention.sliding_window"))
    fail("GGUF '{}': {}attention.sliding_window is not supported by the {} architecture here",
         f.path(), k, ga);
  const GgufFile::TensorInfo& emb = f.tensor("token_embd.weight");
  if (emb.shape.size() != 2 || emb.shape[1] != c.d_model)
    fail("GGUF '{}': token_embd.weight has shape {}, expected [vocab, {}]", f.path(),
         shape_str(emb.shape), c.d_model);
  c.vocab_size = emb.shape[0];
  if (f.has(k + "vocab_size") && f.get_int(k + "vocab_size") != c.vocab_size)
    fail("GGUF '{}': {}vocab_size = {} but token_embd.weight has {} rows", f.path(), k,
         f.get_int(k + "vocab_size"), c.vocab_size);
  c.tied_embeddings = f.find("output.weight") == nullptr;
  if (rotary) read_rope_scaling(f, ga, c);
  if (spec.latent_attention) read_latent_yarn(f, k, c);
  if (gemma) read_gemma(f, ga, c);
  if (arch.moe()) {
    // The router as llama.cpp's graph for ga runs it: softmax, the top
    // expert_used_count renormalised or not (Architecture::gguf_norm_topk);
    // the experts sized by feed_forward_length ("llama") or by
    // expert_feed_forward_length, with a gated shared expert of
    // expert_shared_feed_forward_length where the file has its tensors.
    c.num_experts = positive(f, k + "expert_count", limits::kMaxExperts);
    c.num_experts_per_tok = positive(f, k + "expert_used_count", c.num_experts);
    c.moe_d_ff = c.d_ff;
    if (arch.gguf_expert_ff_keys()) {
      c.moe_d_ff = positive(f, k + "expert_feed_forward_length", limits::kFfn);
      if (!arch.gguf_deepseek_routing() && f.find("blk.0.ffn_gate_shexp.weight")) {
        c.moe_shared_d_ff = positive(f, k + "expert_shared_feed_forward_length", limits::kFfn);
        c.moe_shared_expert_gate = f.find("blk.0.ffn_gate_inp_shexp.weight") != nullptr;
      }
    }
    c.moe_score_func = "softmax";
    c.norm_topk_prob = arch.gguf_norm_topk();
    if (arch.gguf_deepseek_routing()) read_deepseek_routing(f, k, c);
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw e.with_context(fmt::format("GGUF '{}'", f.path()));
  }
  return c;
}

namespace {

// Each parameter's pieces of the file, checked against the layout before
// anything is allocated, and the plan: weight matrices that may be held so
// (block_quantizable: not GPT-2's learned positions, say) and whose pieces
// are all block-quantised or F16 stay so, in runs of consecutive pieces of
// one type (with keep_quantized).
struct GgufPieces {
  std::map<std::string, std::vector<Piece>> pieces;  // each sorted by row0
  std::vector<ExternalTensor> tensors;
  QuantPlan plan;
};

GgufPieces gguf_pieces(const GgufFile& f, const std::string& path, const ModelConfig& c,
                       const ParamLayout& layout, bool keep_quantized) {
  const Architecture& arch = c.architecture();
  GgufPieces out;
  std::map<std::string, std::vector<Piece>>& pieces = out.pieces;
  out.tensors = gguf_file_tensors(f, arch, c);
  const std::vector<ExternalTensor>& tensors = out.tensors;
  auto check_known = [&](const ExternalTensor& e, const GgufFile::TensorInfo& t) {
    if (!t.known)
      fail(
          "GGUF '{}': tensor '{}' is of type {}, which Nekton does not load (f32, f16, bf16, "
          "q8_0, q4_0, q4_k, q6_k)",
          path, e.name, ggml_type_number_name(t.type));
  };
  for (const ExternalTensor& e : tensors) {
    const GgufFile::TensorInfo& t = f.tensor(e.name);
    const ParamInfo& p = layout.find(e.param);
    Shape want = p.shape;
    int64_t row0 = 0;
    if (e.head_split > 0) {
      // Slice h: rows [h block + head_row0, + head_rows) (MLA's attn_k_b, attn_v_b).
      const int64_t H = e.head_split, hr = e.head_rows, in = p.shape[1];
      want = e.transposed ? Shape{H, in, hr} : Shape{H, hr, in};
      if (t.shape != want)
        fail("GGUF '{}': tensor '{}' has shape {}, expected {} (for {})", path, e.name,
             shape_str(t.shape), shape_str(want), e.param);
      check_known(e, t);
      for (int64_t h = 0; h < H; ++h) {
        Piece pc{&t, h * (p.shape[0] / H) + e.head_row0, hr, 0, h * (e.transposed ? in : hr)};
        pc.transposed = e.transposed;
        pieces[e.param].push_back(pc);
      }
      continue;
    }
    if (e.experts > 0) {
      // One piece per expert: slice x of [experts, rows, in] is part x.
      std::vector<Piece> slices;
      for (int64_t x = 0; x < e.experts; ++x) {
        const ParamPart& part = p.part(fmt::format(fmt::runtime(e.part), x));
        want = {e.experts, part.rows, p.shape[1]};
        slices.push_back({&t, part.row0, part.rows, 0, x * part.rows});
      }
      if (t.shape != want)
        fail("GGUF '{}': tensor '{}' has shape {}, expected {} (for {})", path, e.name,
             shape_str(t.shape), shape_str(want), e.param);
      check_known(e, t);
      for (const Piece& pc : slices) pieces[e.param].push_back(pc);
      continue;
    }
    if (!e.part.empty()) {
      row0 = p.part(e.part).row0;
      want[0] = p.part(e.part).rows;
    }
    if (e.flat) want = {p.numel()};  // [1, in] stored as [in]
    if (t.shape != want)
      fail("GGUF '{}': tensor '{}' has shape {}, expected {} (for {})", path, e.name,
           shape_str(t.shape), shape_str(want), e.param);
    check_known(e, t);
    if (e.rope_heads > 0 && want[0] % (2 * e.rope_heads) != 0)
      fail("GGUF '{}': tensor '{}' has {} rows, not whole heads of even size", path, e.name,
           want[0]);
    pieces[e.param].push_back({&t, row0, e.flat ? 1 : want[0], e.rope_heads, 0, e.add});
  }
  for (auto& [name, ps] : pieces) {
    std::sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& b) { return a.row0 < b.row0; });
    bool quantized = keep_quantized && block_quantizable(layout, layout.find(name));
    // (A transposed piece, MLA's attn_k_b, has no rows to keep: kv_b loads dense.)
    for (const Piece& p : ps)
      quantized &=
          kept(GgmlType(p.t->type)) && p.t->shape.size() >= 2 && p.add == 0 && !p.transposed;
    if (!quantized) continue;
    std::vector<QuantRun> runs;
    for (const Piece& p : ps) {
      const ops::QuantType qt = ggml_quant_type(GgmlType(p.t->type));
      if (!runs.empty() && runs.back().type == qt)
        runs.back().rows += p.rows;
      else
        runs.push_back({p.rows, qt});
    }
    out.plan[name] = runs;
  }
  return out;
}

}  // namespace

GgufModel load_gguf_model(const std::string& path, const GgufLoadOptions& opt) {
  std::unique_ptr<GgufFile> file = GgufFile::open(path);
  const GgufFile& f = *file;
  const ModelConfig c = gguf_model_config(f);
  const Architecture& arch = c.architecture();
  const ParamLayout layout = model_layout(c);

  GgufPieces gp = gguf_pieces(f, path, c, layout, opt.keep_quantized);
  std::map<std::string, std::vector<Piece>>& pieces = gp.pieces;
  const std::vector<ExternalTensor>& tensors = gp.tensors;
  const QuantPlan& plan = gp.plan;
  const bool mtp = f.get_int(arch.gguf_arch() + ".nextn_predict_layers", 0) > 0;
  for (const auto& t : f.tensors()) {
    bool used = t.name == "rope_freqs.weight" || t.name == "rope_factors_long.weight" ||
                t.name == "rope_factors_short.weight";
    for (const ExternalTensor& e : tensors) used |= e.name == t.name;
    // A multi-token-prediction layer's (blk.L with L past the model's
    // layers: gguf_model_config logged them).
    if (mtp && t.name.starts_with("blk.")) {
      const std::string l = t.name.substr(4, t.name.find('.', 4) - 4);
      used |= !l.empty() && l.size() < 7 &&
              l.find_first_not_of("0123456789") == std::string::npos && std::stoll(l) >= c.n_layer;
    }
    if (!used)
      NK_WARN("GGUF '{}': tensor '{}' is not used by the {} model", path, t.name,
              arch.display_name());
  }

  std::vector<std::string> all;
  for (const ParamInfo& p : layout.params()) all.push_back(p.name);
  GgufModel out;
  out.model = std::make_unique<Transformer>(
      c, opt.compute, 0, ParamInit::Zeros, all, kHost,
      plan.empty() ? FrozenWeights::Compute : FrozenWeights::Quantized, plan, opt.tp);
  Transformer& m = *out.model;
  const int64_t rank = opt.tp.active() ? opt.tp.rank() : 0, n = opt.tp.active() ? opt.tp.size() : 1;

  double total = 0;
  for (const auto& [name, ps] : pieces)
    for (const Piece& pc : ps) total += gguf_piece_bytes(pc);
  LoadProgress progress(path, total);
  std::vector<float> buf;
  for (const ParamInfo& p : m.layout().params()) {
    const std::vector<Piece>& ps = pieces.at(p.name);
    for (const Piece& pc : ps) progress.advance(gguf_piece_bytes(pc));
    const ParamInfo& g = m.global_layout().find(p.name);  // (the whole, under tensor parallelism)
    if (plan.count(p.name)) {
      copy_quant_share(g, ps, m.quant_parts(p.name), rank, n);
      continue;
    }
    const int64_t in = g.shape.size() > 1 ? g.shape[1] : 1;
    buf.resize(size_t(g.numel()));
    for (const Piece& pc : ps) {
      float* dst = buf.data() + pc.row0 * in;
      decode_rows(pc, in, dst);
      if (pc.add != 0)
        for (int64_t i = 0; i < pc.rows * in; ++i) dst[i] -= pc.add;
    }
    Tensor src = Tensor::from_blob(buf.data(), g.shape, DType::F32);
    check_finite(src, path, ps.front().t->name, opt.allow_nonfinite);
    m.set_param_from_whole(p, src);
  }
  m.sync_compute_params();
  progress.finish();

  out.tokenizer = gguf_tokenizer(f);
  out.chat_template = f.get_string("tokenizer.chat_template", "");
  out.name = f.get_string("general.name", "");
  if (out.name.empty()) out.name = fs::path(path).stem().string();
  return out;
}

void check_gguf_tensor_parallel(const GgufFile& f, const std::string& path, int64_t tp) {
  if (tp <= 1) return;
  const ModelConfig c = gguf_model_config(f);
  const ParamLayout layout = model_layout(c);
  const GgufPieces gp = gguf_pieces(f, path, c, layout, true);
  const ParamLayout whole = Transformer::tensor_parallel_global(layout, tp, 0);
  for (const auto& [name, runs] : gp.plan) {
    const ParamInfo& g = whole.find(name);
    const Shape local = shard_shape(tensor_split(g), tp);
    for (int64_t r = 0; r < tp; ++r) quant_share_runs(g, local, runs, r, tp);
  }
}

}  // namespace nk
