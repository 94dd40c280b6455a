// Helpers the Hugging Face suites share (hf_test.cc, hf_arch_test.cc): models
// written by the independent reference (tests/ckpt/hf_reference.py), Nekton's
// logits and greedy continuations, and their comparison.
//
// Tolerance: max |nekton - reference| / max |reference|. The reference
// computes in float64, Nekton in fp32 with its own summation order; over the
// tiny 2-layer models the difference is ~1e-7, so 1e-4 (kHfTol) and the
// tighter 1e-5 catch any wrong term (a transposed or misplaced tensor or a
// wrong rotary frequency moves logits by far more).
#pragma once
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/hf_io.h"
#include "ckpt/model_io.h"
#include "ckpt/safetensors.h"
#include "tensor_util.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk::test {

inline constexpr double kHfTol = 1e-4;

inline const std::string kReference =
    std::string("/usr/bin/python3 ") + NK_SOURCE_DIR + "/tests/ckpt/hf_reference.py";

inline nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_file(path));
}

inline void write_json(const std::string& path, const nlohmann::json& j) {
  write_file(path, j.dump(2));
}

inline nlohmann::json llama_spec() {
  return {{"arch", "llama"}, {"vocab", 97},    {"ctx", 32},     {"layers", 2},
          {"hidden", 32},    {"heads", 4},     {"kv_heads", 2}, {"ffn", 48},
          {"tied", false},   {"dtype", "F32"}, {"shards", 1},   {"seed", 1}};
}

inline nlohmann::json gpt2_spec() {
  return {{"arch", "gpt2"}, {"vocab", 97}, {"ctx", 32},      {"layers", 2},
          {"hidden", 32},   {"heads", 4},  {"ffn", 128},     {"tied", true},
          {"dtype", "F32"}, {"shards", 1}, {"prefix", true}, {"seed", 2}};
}

// Writes a random HF model as `spec` says into tmp/NAME; its reference logits
// and greedy continuation go to tmp/NAME.ref.safetensors.
inline std::string write_hf(const TempDir& tmp, const std::string& name,
                            const nlohmann::json& spec) {
  write_json(tmp / (name + ".spec.json"), spec);
  RunResult r =
      run_command(kReference + " write " + (tmp / name) + " " + (tmp / (name + ".spec.json")) +
                  " " + (tmp / (name + ".ref.safetensors")));
  if (r.code != 0) throw std::runtime_error("hf_reference.py write failed:\n" + r.out);
  return tmp / name;
}

inline std::vector<int32_t> ints(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

inline std::vector<float> floats(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  ops::copy_to_host(t, v.data());
  return v;
}

inline Tensor logits_of(Transformer& m, const Tensor& tokens) {
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  Activations a(m.config(), DType::F32, B, T, false);
  Tensor out = Tensor::empty({B * T, m.config().vocab_size}, DType::F32);
  m.forward_all_logits(a, tokens, out);
  return out;
}

inline std::vector<int32_t> greedy(Transformer& m, std::vector<int32_t> seq, size_t n) {
  const size_t prompt = seq.size();
  const int64_t V = m.config().vocab_size;
  for (size_t i = 0; i < n; ++i) {
    const int64_t T = int64_t(seq.size());
    Activations a(m.config(), DType::F32, 1, T, false);
    Tensor lg = Tensor::empty({1, V}, DType::F32);
    m.forward_last_logits(a, i32_tensor({1, T}, seq), lg);
    std::vector<float> h = floats(lg);
    seq.push_back(int32_t(std::max_element(h.begin(), h.end()) - h.begin()));
  }
  return std::vector<int32_t>(seq.begin() + ptrdiff_t(prompt), seq.end());
}

inline double max_rel_diff(const Tensor& ours, const Tensor& ref) {
  std::vector<float> a = floats(ours), b = floats(ref);
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

// Loads the imported model and compares it with the reference results of `name`.
inline void expect_matches_reference(const TempDir& tmp, const std::string& name,
                                     const std::string& model_dir, double tol = kHfTol) {
  auto model = load_model(model_dir, DType::F32);
  SafetensorsFile ref = SafetensorsFile::open(tmp / (name + ".ref.safetensors"));
  Tensor logits = logits_of(*model, ref.get("tokens"));
  double rel = max_rel_diff(logits, ref.get("logits"));
  std::vector<int32_t> want = ints(ref.get("greedy"));
  std::vector<int32_t> got = greedy(*model, ints(ref.get("prompt")), want.size());
  std::cout << "[ " << name << " ] import: logits max relative difference " << rel << "\n";
  EXPECT_LT(rel, tol) << name;
  EXPECT_EQ(got, want) << name << ": greedy continuation differs";
}

// Nekton's logits and greedy continuation of `model` after the first
// `prompt_len` tokens, for the reference to check.
inline void write_nekton_results(Transformer& model, const std::string& path, int64_t T = 16,
                                 int64_t prompt_len = 5) {
  const int64_t B = 2, V = model.config().vocab_size;
  std::vector<int32_t> tok(B * T);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 37 + 11) % size_t(V));
  Tensor tokens = i32_tensor({B, T}, tok);
  std::vector<int32_t> prompt(tok.begin(), tok.begin() + prompt_len);
  std::vector<int32_t> cont = greedy(model, prompt, 6);
  save_safetensors(path, {{"tokens", tokens},
                          {"logits", logits_of(model, tokens)},
                          {"prompt", i32_tensor({prompt_len}, prompt)},
                          {"greedy", i32_tensor({6}, cont)}});
}

inline void expect_reference_agrees(const std::string& hf_dir, const std::string& results,
                                    const std::string& what, double tol = kHfTol) {
  RunResult r =
      run_command(kReference + " check " + hf_dir + " " + results + " " + fmt::format("{:g}", tol));
  std::cout << "[ " << what << " ] export: " << r.out;
  EXPECT_EQ(r.code, 0) << what << ": the reference disagrees:\n" << r.out;
}

struct RawTensor {
  std::string dtype;
  Shape shape;
  std::string bytes;
  bool operator==(const RawTensor&) const = default;
};

// Every tensor of every .safetensors file in `dir`.
inline std::map<std::string, RawTensor> hf_tensors(const std::string& dir) {
  std::map<std::string, RawTensor> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    SafetensorsFile f = SafetensorsFile::open(e.path().string());
    for (const SafetensorsEntry& t : f.entries()) {
      Tensor v = f.get(t.name);
      out[t.name] = {safetensors_dtype_name(t.dtype), t.shape,
                     std::string(static_cast<const char*>(v.raw()), v.nbytes())};
    }
  }
  return out;
}

// Nothing named OUT or OUT.tmp.* / OUT.old.* exists beside OUT.
inline void expect_nothing_written(const std::string& out) {
  EXPECT_FALSE(fs::exists(out)) << out;
  std::string base = fs::path(out).filename().string();
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path()))
    EXPECT_FALSE(e.path().filename().string().starts_with(base + "."))
        << "left behind: " << e.path();
}

inline void expect_import_error(const std::string& hf, const std::string& out,
                                const std::vector<std::string>& parts) {
  std::string e = error_of([&] { import_hf(hf, out); });
  for (const std::string& p : parts) EXPECT_TRUE(contains(e, p)) << "'" << p << "' not in: " << e;
  expect_nothing_written(out);
}

}  // namespace nk::test
