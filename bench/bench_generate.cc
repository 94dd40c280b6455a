// Greedy generation throughput of the KV-cache engine (infer/Generator) on a
// randomly initialised model, or on a GGUF file's (PRESET = FILE.gguf: its
// weights kept in their types, ckpt/gguf_import.h). Usage:
//   bench_generate PRESET|FILE.gguf DTYPE BATCH PROMPT NEW [REPS] [BLOCK] [model.KEY=VALUE...]
// (threads from OMP_NUM_THREADS; the model.* overrides resize a preset, e.g.
// deepseek_v3-tiny with model.n_head=32 model.kv_lora_rank=256). All prompts are prefilled in one
// step, so the first streamed token marks the end of the prefill; decode ms/step is the time after
// it over NEW - 1 steps. tokens/s counts generated tokens over the whole run (prefill included) and
// over decoding alone. The last line is JSON for the scripts. Best of REPS runs (default 1) after a
// warm-up run. BLOCK > 0 runs over a paged cache (infer/paged_cache.h) of blocks of BLOCK
// positions, exactly enough for the batch, prefix caching off (every rep
// computes the same prompts); without it, the contiguous SlotCache.
// BENCH_WARMUP_PROMPT=K: the warm-up run's prompts cut to their first K
// tokens (a long context's prefill then runs once per rep, not twice).
// BENCH_PROFILE=1: after the timed runs, one more run with the kernel
// profile on (ops/kernel_profile.h), its ten slowest kernels printed.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "ckpt/gguf_import.h"
#include "core/config.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "infer/generate.h"
#include "infer/paged_cache.h"
#include "ops/kernel_profile.h"

using namespace nk;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  std::vector<std::string> args, overrides;  // positional; model.KEY=VALUE
  std::string kv_key = "auto";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("kv_cache_dtype=", 0) == 0)
      kv_key = a.substr(a.find('=') + 1);
    else
      (a.find('=') != std::string::npos ? overrides : args).push_back(a);
  }
  const KvDType kv = parse_kv_cache_dtype(kv_key, "kv_cache_dtype");
  if (args.size() < 5) {
    fmt::print(stderr,
               "usage: bench_generate PRESET f32|bf16 BATCH PROMPT NEW [REPS] [BLOCK] "
               "[model.KEY=VALUE...]\n");
    return 1;
  }
  const std::string preset = args[0];
  const DType dt = parse_dtype(args[1]);
  const int64_t B = std::atoll(args[2].c_str()), P = std::atoll(args[3].c_str()),
                N = std::atoll(args[4].c_str());
  const int reps = args.size() > 5 ? std::atoi(args[5].c_str()) : 1;
  const int64_t block = args.size() > 6 ? std::atoll(args[6].c_str()) : 0;
  auto t0 = Clock::now();
  std::unique_ptr<Transformer> owned;
  if (is_gguf_path(preset)) {
    GgufLoadOptions o;
    o.compute = dt;
    owned = std::move(load_gguf_model(preset, o).model);
    owned->pack_quant_weights();  // as nekton generate and serve load it
  } else {
    ModelConfig c = model_preset(preset);
    if (!overrides.empty()) {
      overrides.insert(overrides.begin(), "model.preset=" + preset);
      c = model_config_from(Config::load(model_schema(), "", overrides));
    }
    owned = std::make_unique<Transformer>(c, dt, 1);
  }
  Transformer& model = *owned;
  const ModelConfig& cfg = model.config();
  const double init_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<GenerationRequest> reqs(static_cast<size_t>(B));
  Rng rng(7);
  for (auto& r : reqs) {
    for (int64_t i = 0; i < P; ++i)
      r.prompt.push_back(int32_t(rng.below(uint64_t(cfg.vocab_size))));
    r.max_new_tokens = N;
    r.stop_at_eos = false;
    r.sampling.temperature = 0;
  }
  std::unique_ptr<Generator> g;
  if (block > 0) {
    PagedCacheOptions o;
    o.block_size = block;
    o.max_len = P + N;
    o.blocks = B * ((o.max_len + block - 1) / block);
    o.max_seqs = B;
    o.max_tokens = B * P;
    o.prefix_caching = false;
    o.kv_dtype = kv;
    g = std::make_unique<Generator>(model, nullptr, std::make_unique<PagedCache>(cfg, dt, o), B);
  } else {
    g = std::make_unique<Generator>(model, nullptr, B, B * P, /*max_len=*/0, kv);
  }
  Generator& gen = *g;
  double best_total = 1e30, best_prefill = 0, best_decode = 1e30;
  std::vector<GenerationRequest> warm = reqs;
  if (const char* w = std::getenv("BENCH_WARMUP_PROMPT"))
    for (GenerationRequest& r : warm)
      r.prompt.resize(size_t(std::clamp<int64_t>(std::atoll(w), 1, P)));
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up (cache, scratch, primitives)
    Clock::time_point first{};
    bool seen = false;
    auto start = Clock::now();
    gen.run(rep == 0 && reps > 0 ? warm : reqs, [&](int64_t, int32_t, std::string_view) {
      if (!seen) first = Clock::now(), seen = true;
    });
    auto end = Clock::now();
    if (rep == 0 && reps > 0) continue;
    const double total = std::chrono::duration<double>(end - start).count();
    const double prefill = std::chrono::duration<double>(first - start).count();
    const double decode = N > 1 ? (total - prefill) / double(N - 1) : 0;
    if (total < best_total) best_total = total, best_prefill = prefill;
    best_decode = std::min(best_decode, decode);
  }
  if (const char* p = std::getenv("BENCH_PROFILE"); p && std::string(p) == "1") {
    ops::reset_kernel_profile();
    ops::set_kernel_profiling(true);
    gen.run(reqs, [](int64_t, int32_t, std::string_view) {});
    ops::set_kernel_profiling(false);
    const std::vector<ops::KernelTime> k = ops::kernel_profile();
    for (size_t i = 0; i < k.size() && i < 10; ++i)
      fmt::print("  {:<28} {:>8} calls {:>9.3f} ms\n", k[i].name, k[i].calls, 1e3 * k[i].seconds);
  }
  const double tps = double(B * N) / best_total, dtps = double(B) / best_decode;
  fmt::print(
      "{} {} kv={} threads={} batch={} prompt={} new={} block={}: prefill {:.3f} s, decode {:.2f} "
      "ms/step, "
      "{:.1f} tokens/s overall, {:.1f} tokens/s decoding, prompt {:.1f} tokens/s (init {:.1f} "
      "s)\n",
      preset, dtype_name(dt), kv ? kv_cache_dtype_name(*kv) : "auto", num_threads(), B, P, N, block,
      best_prefill, 1e3 * best_decode, tps, dtps, double(B * P) / best_prefill, init_s);
  fmt::print(
      "{{\"impl\": \"nekton\", \"preset\": \"{}\", \"dtype\": \"{}\", \"kv_cache_dtype\": \"{}\", "
      "\"batch\": {}, \"prompt\": "
      "{}, "
      "\"new\": {}, \"prefill_s\": {:.4f}, \"decode_ms\": {:.3f}, \"tokens_per_s\": {:.2f}, "
      "\"decode_tokens_per_s\": {:.2f}, \"prompt_tokens_per_s\": {:.2f}}}\n",
      preset, dtype_name(dt), kv ? kv_cache_dtype_name(*kv) : "auto", B, P, N, best_prefill,
      1e3 * best_decode, tps, dtps, double(B * P) / best_prefill);
  return 0;
}
