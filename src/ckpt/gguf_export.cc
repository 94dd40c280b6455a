#include "ckpt/gguf_export.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/gguf_vocab.h"
#include "ckpt/model_io.h"
#include "core/error.h"

namespace nk {

namespace fs = std::filesystem;

namespace {

// llama.cpp's llama_ftype for a file whose matrices are all of type t.
uint32_t file_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return 0;
    case GgmlType::F16:
      return 1;
    case GgmlType::Q8_0:
      return 7;
    case GgmlType::BF16:
      return 32;
  }
  return 0;
}

ModelConfig read_config(const std::string& dir) {
  fs::path p = fs::path(dir) / "config.json";
  if (!fs::is_directory(dir)) fail("model folder '{}' does not exist", dir);
  std::ifstream in(p);
  if (!in) fail("model '{}': cannot read {}", dir, p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return model_config_from_json(ss.str(), p.string());
}

std::string folder_name(const std::string& dir) {
  fs::path p = fs::path(dir);
  if (p.filename().empty()) p = p.parent_path();  // "DIR/"
  return fs::absolute(p).lexically_normal().filename().string();
}

}  // namespace

void permute_rope_rows(const float* src, float* dst, int64_t n_heads, int64_t head_dim,
                       int64_t in) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t s = 0; s < 2; ++s) {
        const float* from = src + (h * head_dim + s * half + j) * in;
        std::copy(from, from + in, dst + (h * head_dim + 2 * j + s) * in);
      }
}

GgufExportResult export_gguf(const std::string& model_dir, const std::string& out_path,
                             const GgufExportOptions& opt) {
  const ModelConfig c = read_config(model_dir);
  if (!c.is_llama())
    fail("GGUF export supports Llama-family models; '{}' is {} (config.json arch)", model_dir,
         c.arch);
  if (c.head_dim() % 2 != 0)
    fail("model '{}': head_dim {} is odd; rotary embeddings need an even one", model_dir,
         c.head_dim());

  GgufWriter w;
  GgufExportResult result;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", opt.name.empty() ? folder_name(model_dir) : opt.name);
  w.add_u32("general.file_type", file_type(opt.type));
  if (opt.type == GgmlType::Q8_0) w.add_u32("general.quantization_version", 2);
  w.add_u32("general.alignment", 32);
  w.add_u32("llama.context_length", uint32_t(c.max_seq_len));
  w.add_u32("llama.embedding_length", uint32_t(c.d_model));
  w.add_u32("llama.block_count", uint32_t(c.n_layer));
  w.add_u32("llama.feed_forward_length", uint32_t(c.d_ff));
  w.add_u32("llama.attention.head_count", uint32_t(c.n_head));
  w.add_u32("llama.attention.head_count_kv", uint32_t(c.n_kv_head));
  w.add_f32("llama.rope.freq_base", float(c.rope_theta));
  w.add_f32("llama.attention.layer_norm_rms_epsilon", float(c.norm_eps));
  w.add_u32("llama.rope.dimension_count", uint32_t(c.head_dim()));
  w.add_u32("llama.vocab_size", uint32_t(c.vocab_size));

  // The tokenizer before the weights: its errors are cheaper to find.
  if (opt.tokenizer) {
    std::string spec = stored_tokenizer(model_dir);
    if (spec.empty())
      fail(
          "model '{}' has no tokenizer stored with it (no tokenizer.txt): llama.cpp needs one "
          "to run the GGUF; pass --no-tokenizer to export the weights alone",
          model_dir);
    std::unique_ptr<Tokenizer> tok;
    try {
      tok = load_tokenizer(spec);
    } catch (const Error& e) {
      throw e.with_context(fmt::format("model '{}': tokenizer '{}'", model_dir, spec));
    }
    GgufVocab v = gguf_vocab(*tok, c.vocab_size);
    add_gguf_vocab(w, v);
    result.tokenizer = v.model;
  }

  std::unique_ptr<Transformer> model = load_model(model_dir, DType::F32);
  Transformer* m = model.get();
  const int64_t C = c.d_model, hd = c.head_dim(), F = c.d_ff;
  const int64_t q_rows = c.n_head * hd, kv_rows = c.n_kv_head * hd;

  // Rows [row0, row0 + rows) of parameter `name` ([*, in]), optionally with
  // the rope permutation over `heads` heads.
  auto rows_of = [m](std::string name, int64_t row0, int64_t rows, int64_t in, int64_t heads) {
    return [m, name, row0, rows, in, heads](std::vector<float>& out) {
      const float* p = ParamLayout::view(m->params(), m->layout().find(name)).data<float>();
      const float* src = p + row0 * in;
      out.resize(size_t(rows * in));
      if (heads > 0)
        permute_rope_rows(src, out.data(), heads, rows / heads, in);
      else
        std::copy(src, src + rows * in, out.begin());
    };
  };
  auto whole = [&](const std::string& name) {
    const Shape& s = m->layout().find(name).shape;
    return rows_of(name, 0, s[0], s.size() > 1 ? s[1] : 1, 0);
  };
  auto matrix = [&](const std::string& gguf_name, int64_t rows, int64_t in,
                    GgufWriter::Producer p) {
    w.add_tensor(gguf_name, {rows, in}, opt.type, std::move(p));
  };
  auto norm = [&](const std::string& gguf_name, const std::string& name) {
    w.add_tensor(gguf_name, {C}, GgmlType::F32, whole(name));
  };

  matrix("token_embd.weight", c.vocab_size, C, whole("wte"));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    std::string h = fmt::format("h.{}.", l), b = fmt::format("blk.{}.", l);
    std::string qkv = h + "attn.qkv.weight", up = h + "mlp.up.weight";
    norm(b + "attn_norm.weight", h + "ln1.weight");
    matrix(b + "attn_q.weight", q_rows, C, rows_of(qkv, 0, q_rows, C, c.n_head));
    matrix(b + "attn_k.weight", kv_rows, C, rows_of(qkv, q_rows, kv_rows, C, c.n_kv_head));
    matrix(b + "attn_v.weight", kv_rows, C, rows_of(qkv, q_rows + kv_rows, kv_rows, C, 0));
    matrix(b + "attn_output.weight", C, q_rows, whole(h + "attn.proj.weight"));
    norm(b + "ffn_norm.weight", h + "ln2.weight");
    matrix(b + "ffn_gate.weight", F, C, rows_of(up, 0, F, C, 0));
    matrix(b + "ffn_up.weight", F, C, rows_of(up, F, F, C, 0));
    matrix(b + "ffn_down.weight", C, F, whole(h + "mlp.down.weight"));
  }
  norm("output_norm.weight", "ln_f.weight");
  // Tied: llama.cpp falls back to token_embd for the output projection.
  if (!c.tied_embeddings) matrix("output.weight", c.vocab_size, C, whole("lm_head.weight"));

  w.write(out_path);
  result.tensors = w.tensor_count();
  return result;
}

}  // namespace nk
