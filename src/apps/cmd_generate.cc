#include <fmt/format.h>

#include <cstdio>

#include "apps/commands.h"
#include "ckpt/model_io.h"
#include "data/tokenizer.h"
#include "infer/generate.h"

namespace nk {

namespace {

ConfigSchema generate_schema() {
  ConfigSchema s;
  s.add_string("generate.model", "", "saved model folder (config.json + model.safetensors)");
  s.add_string("generate.tokenizer", "",
               "tokenizer spec (default: the one saved with the model, else bytes)");
  s.add_string("generate.prompt", "\n", "text to continue");
  s.add_int("generate.max_tokens", 200, "tokens to generate");
  s.add_float("generate.temperature", 0.8, "softmax temperature (0 = greedy)");
  s.add_int("generate.top_k", 40, "sample among the k most likely tokens (0 = all)");
  s.add_float("generate.top_p", 0.95, "nucleus sampling mass (1 = off)");
  s.add_int("generate.seed", 0, "sampling seed");
  s.add_string("generate.dtype", "f32", "compute precision: f32 or bf16");
  return s;
}

}  // namespace

void print_sample(Transformer& model, const Tokenizer& tok, const std::string& prompt,
                  int64_t max_tokens, const SamplingConfig& sc) {
  Sampler sampler(sc);
  fmt::print("{}", prompt);
  std::vector<int32_t> ids = tok.encode(prompt);
  if (ids.empty()) fail("generate.prompt: encodes to no tokens");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= model.config().vocab_size)
      fail("generate.tokenizer: token {} of the prompt is outside the model's vocabulary ({})",
           ids[i], model.config().vocab_size);
  // Bytes are printed as they come; a UTF-8 character may span tokens.
  generate(model, ids, max_tokens, sampler, [&](int32_t id) {
    if (id == tok.eod_id()) return false;
    std::string bytes = tok.decode(std::vector<int32_t>{id});
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  fmt::print("\n");
}

int cmd_generate(const CommandArgs& a) {
  ConfigSchema schema = generate_schema();
  if (a.help) {
    fmt::print("usage: nekton generate generate.model=DIR [key=value ...]\n\n{}", schema.help());
    return 0;
  }
  Config c = Config::load(schema, a.config_path, a.overrides);
  std::string dir = c.get_string("generate.model");
  if (dir.empty()) fail("generate.model: no model folder given (generate.model=DIR)");
  SamplingConfig sc;
  sc.temperature = c.get_float("generate.temperature");
  sc.top_k = c.get_int("generate.top_k");
  sc.top_p = c.get_float("generate.top_p");
  sc.seed = uint64_t(c.get_int("generate.seed"));
  if (sc.temperature < 0) fail("generate.temperature: must be >= 0, got {}", sc.temperature);
  if (sc.top_k < 0) fail("generate.top_k: must be >= 0, got {}", sc.top_k);
  if (!(sc.top_p > 0 && sc.top_p <= 1)) fail("generate.top_p: must be in (0, 1], got {}", sc.top_p);
  int64_t max_tokens = c.get_int("generate.max_tokens");
  if (max_tokens < 0) fail("generate.max_tokens: must be >= 0, got {}", max_tokens);
  std::string prompt = c.get_string("generate.prompt");
  if (prompt.empty()) fail("generate.prompt: must not be empty");
  std::string spec = c.get_string("generate.tokenizer");
  if (spec.empty()) spec = stored_tokenizer(dir);
  if (spec.empty()) spec = "bytes";
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(spec);
  } catch (const Error& e) {
    throw e.with_context("generate.tokenizer");
  }
  auto model = load_model(dir, parse_dtype(c.get_string("generate.dtype")));
  print_sample(*model, *tok, prompt, max_tokens, sc);
  return 0;
}

}  // namespace nk
