#include "model/kv_cache.h"

#include "model/arch.h"

#include <algorithm>

#include "ops/ops.h"

namespace nk {

const char* const kKvCacheDtypeDoc =
    "dtype the KV cache keeps keys and values in: auto (the compute dtype), f32, bf16, f16 or "
    "q8_0 (bf16 and f16 halve an f32 model's cache per token; q8_0, CPU only, keeps 32 values "
    "in 34 bytes, 0.53 of bf16's; values are rounded once when stored)";

KvDType parse_kv_cache_dtype(const std::string& value, const std::string& key) {
  if (value == "auto") return std::nullopt;
  if (value == "q8_0") return DType::U8;
  try {
    return parse_dtype(value);  // f32, bf16, f16 and their long names
  } catch (const Error&) {
    fail("{}: '{}' is not a KV cache dtype (auto, f32, bf16, f16 or q8_0)", key, value);
  }
}

const char* kv_cache_dtype_name(DType kv) {
  return kv == DType::U8 ? "q8_0" : dtype_name(kv);
}

void check_kv_cache_dtype(const ModelConfig& c, KvDType kv, Device device, const std::string& key) {
  if (kv != DType::U8) return;
  if (device != kHost)
    fail("{}: the q8_0 KV cache runs on the CPU alone, not on {}", key, device_name(device));
  const int64_t row = c.mla() ? c.kv_lora_rank + c.qk_rope_head_dim : c.head_dim();
  if (row % ops::kKvQ8Values)
    fail("{}: a q8_0 KV cache needs rows of a multiple of {} values; this model's {} is {}", key,
         ops::kKvQ8Values, c.mla() ? "latent row (kv_lora_rank + qk_rope_head_dim)" : "head_dim",
         row);
}

KVCache::KVCache(const ModelConfig& c, DType dt, int64_t slots, int64_t max_len, int64_t max_tokens,
                 Device device, KvDType kv, int64_t tp, int64_t etp)
    : KVCache(c, dt, KVCacheShape{slots, max_len, max_len, slots, max_tokens, tp, etp}, device,
              kv) {}

namespace {

// Bytes of one cache row of `values` values in dtype kv (q8_0: whole blocks).
int64_t row_bytes(int64_t values, DType kv) {
  return ops::kv_cache_row_width(values, kv) * int64_t(dtype_size(kv));
}

}  // namespace

int64_t KVCache::block_bytes(const ModelConfig& c, DType kv, int64_t block_size, int64_t tp) {
  if (c.mla()) return c.n_layer * block_size * row_bytes(c.kv_lora_rank + c.qk_rope_head_dim, kv);
  return 2 * c.n_layer * (c.n_kv_head / tp) * block_size * row_bytes(c.head_dim(), kv);
}

int64_t KVCache::head_token_bytes(const ModelConfig& c, DType kv) {
  // An MLA model's per-head rows may not be whole q8_0 blocks: counted at a byte a value.
  const int64_t D = c.head_dim();
  const int64_t row = kv == DType::U8 && D % ops::kKvQ8Values ? D : row_bytes(D, kv);
  return 2 * c.n_layer * c.n_kv_head * row;
}

KVCache::KVCache(const ModelConfig& c, DType dt, const KVCacheShape& sh, Device device, KvDType kv)
    : shape_(sh),
      dtype_(dt),
      kv_dtype_(kv.value_or(dt)),
      latent_(c.mla()),
      head_token_bytes_(head_token_bytes(c, kv_dtype_)) {
  NK_CHECK(kv_dtype_ == DType::F32 || kv_dtype_ == DType::BF16 || kv_dtype_ == DType::F16 ||
               kv_dtype_ == DType::U8,
           "KVCache: dtype {} for keys and values (f32, bf16, f16 or u8 for q8_0)",
           dtype_name(kv_dtype_));
  if (kv_dtype_ == DType::U8 && device != kHost)
    fail("kv_cache_dtype=q8_0: the q8_0 KV cache runs on the CPU alone, not on {}",
         device_name(device));
  NK_CHECK(
      sh.blocks > 0 && sh.block_size > 0 && sh.max_len > 0 && sh.max_seqs > 0 && sh.max_tokens > 0,
      "KVCache: blocks {}, block size {}, max_len {}, sequences {}, tokens {}", sh.blocks,
      sh.block_size, sh.max_len, sh.max_seqs, sh.max_tokens);
  if (sh.max_len > c.max_seq_len)
    fail("KVCache: {} positions exceed model.max_seq_len = {}", sh.max_len, c.max_seq_len);
  // Tensor parallel: this rank's heads, MLP units and vocabulary columns,
  // and its share of the experts' units.
  const int64_t t = sh.tp, te = sh.expert_ranks();
  NK_CHECK(t >= 1 && c.n_head % t == 0 && c.n_kv_head % t == 0 && c.d_ff % t == 0 && te >= 1 &&
               t % te == 0 && c.expert_d_ff() % te == 0 && c.moe_shared_d_ff % te == 0,
           "KVCache: {} tensor-parallel ranks ({} for the experts) for {} heads, {} kv heads, d_ff "
           "{}, expert d_ff {}, shared {}",
           t, te, c.n_head, c.n_kv_head, c.d_ff, c.expert_d_ff(), c.moe_shared_d_ff);
  const int64_t D = c.head_dim(), C = c.d_model, up = c.mlp_up_dim() / t;
  const int64_t Lr = c.kv_lora_rank + c.qk_rope_head_dim;  // a latent row
  // A row's elements: its values, or a q8_0 row's bytes.
  const int64_t row = ops::kv_cache_row_width(latent_ ? Lr : D, kv_dtype_);
  auto zeros = [&](int64_t heads) {
    if (kv_dtype_ == DType::U8)
      return Tensor::zeros({sh.blocks, heads, sh.block_size, row}, kv_dtype_);
    Tensor t = Tensor::empty({sh.blocks, heads, sh.block_size, row}, kv_dtype_, device);
    ops::fill(t, 0.f);
    return t;
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (latent_) {
      k.push_back(zeros(1));
      v.push_back(k.back());
      continue;
    }
    k.push_back(zeros(c.n_kv_head / t));
    v.push_back(zeros(c.n_kv_head / t));
  }
  const int64_t R = sh.max_tokens;
  tokens = Tensor::empty({R}, DType::I32, device);
  seq_ids = Tensor::empty({R}, DType::I32, device);
  positions = Tensor::empty({R}, DType::I32, device);
  table = Tensor::empty({sh.max_seqs, sh.table_width()}, DType::I32, device);
  x = Tensor::empty({R, C}, dt, device);
  ln = Tensor::empty({R, C}, dt, device);
  // A latent cache's attention: the absorbed queries, the row as key and
  // value, each head's weighted row (LatentAttention::CacheActs).
  qkv = Tensor::empty({R, latent_ ? (c.n_head / t + 2) * Lr : c.qkv_dim() / t}, dt, device);
  att = Tensor::empty({R, c.n_head / t * (latent_ ? Lr : D)}, dt, device);
  tmp = Tensor::empty({R, C}, dt, device);
  auto mk = [&](const Shape& s, DType type) { return Tensor::empty(s, type, device); };
  if (c.block().qk_norm)
    qk = nn::SelfAttention::qk_acts_for(R, c.n_head / t, c.n_kv_head / t, D, dt, mk);
  if (c.mla())
    mla = nn::LatentAttention::acts_for(R, c.n_head / t, c.q_lora_rank, c.kv_lora_rank,
                                        D - c.qk_rope_head_dim, c.qk_rope_head_dim, c.v_head_dim,
                                        dt, mk);
  if (latent_) {
    const int64_t w =
        std::max({D - c.qk_rope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank, c.v_head_dim});
    mla_cache = {qkv, att, mk(Shape{R * w}, dt), mk(Shape{R * w}, dt)};
  }
  if (c.is_moe()) {
    moe = nn::MoE::saved_for(R, C, c.num_experts, c.num_experts_per_tok, c.expert_d_ff() / te, dt,
                             mk);
    if (c.moe_shared_d_ff > 0)
      nn::MoE::add_shared(&moe, nullptr, R, C, c.moe_shared_d_ff / te, c.moe_shared_expert_gate, dt,
                          mk);
  }
  if (c.has_dense_layers()) {
    h = Tensor::empty({R, up}, dt, device);
    a = Tensor::empty({R, c.d_ff / t}, dt, device);
  }
  mean = Tensor::empty({R}, DType::F32, device);
  rstd = Tensor::empty({R}, DType::F32, device);
  // The head runs on at most max_seqs rows at a time (one per sequence in a
  // decode step); more rows are done in several passes.
  head_rows = std::min(R, sh.max_seqs);
  sel = Tensor::empty({head_rows, C}, dt, device);
  const int64_t V = t > 1 ? c.padded_vocab_size(t) / t : c.vocab_size;
  head_logits = Tensor::empty({head_rows, V}, dt, device);
  if (t > 1) {
    head_f32 = Tensor::empty({head_rows * V}, DType::F32, device);
    logits_all = Tensor::empty({t * head_rows * V}, DType::F32, device);
  }
  const AdapterSizes s = adapter_sizes(c);
  adapters = make_adapter_scratch(c, s, R, dt, device, false);
  int64_t saved = 0, saved_f32 = 0;  // per token, the most any adapted layer keeps
  for (size_t l = 0; l < s.saved.size(); ++l) {
    saved = std::max(saved, *std::max_element(s.saved[l].begin(), s.saved[l].end()));
    saved_f32 =
        std::max(saved_f32, *std::max_element(s.saved_f32[l].begin(), s.saved_f32[l].end()));
  }
  if (saved) lora_h = Tensor::empty({saved * R}, dt, device);
  if (saved_f32) adapter_stats = Tensor::empty({saved_f32 * R}, DType::F32, device);
  if (c.is_moe() && adapters)  // the experts' adapters (any layer's: one at a time)
    moe.up_adapters = moe.down_adapters = moe.shared_up_adapters = moe.shared_down_adapters =
        nn::AdapterActs{lora_h, adapters.get(), adapter_stats};
  if (c.prompt.enabled())
    prompt = nn::Prompt::saved_for(c.prompt.virtual_tokens, C, c.prompt.encoder_hidden, dt, device);
}

int64_t KVCache::cache_bytes() const {
  int64_t b = 0;
  for (size_t l = 0; l < k.size(); ++l) b += int64_t(k[l].nbytes() + (latent_ ? 0 : v[l].nbytes()));
  return b;
}

std::string KVCache::describe() const {
  const int64_t positions = shape_.blocks * shape_.block_size, per = cache_bytes() / positions;
  std::string latent;
  if (latent_)
    latent = fmt::format(" (latent rows of {} values per layer; per-head keys and values: {})",
                         ops::kv_cache_head_dim(k[0]), head_token_bytes_);
  return fmt::format("KV cache {} (compute {}): {} bytes/token{}, {:.2f} MiB for {} positions",
                     kv_cache_dtype_name(kv_dtype_), dtype_name(dtype_), per, latent,
                     double(cache_bytes()) / (1 << 20), positions);
}

}  // namespace nk
