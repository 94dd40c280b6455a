// Single-thread encode throughput of the byte-level BPE tokenizers on the
// multilingual corpus of the parity tests (tests/data/tokenizer/bpe_corpus.h).
//   bench_tokenizer [--corpus-out FILE] [--reps N] [names...]
// Prints one JSON line per tokenizer. --corpus-out writes the corpus (u32 length
// + bytes per document) so bench/tiktoken_bench.js times the same documents.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "../tests/data/tokenizer/bpe_corpus.h"
#include "data/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  std::string corpus_out;
  int reps = 5;
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--corpus-out") && i + 1 < argc)
      corpus_out = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else
      names.push_back(argv[i]);
  }
  if (names.empty()) names = {"gpt2", "cl100k_base", "o200k_base"};
  auto docs = nk::testing::bpe_corpus(1 << 20);
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.text.size();
  if (!corpus_out.empty()) {
    std::ofstream f(corpus_out, std::ios::binary);
    for (const auto& d : docs) {
      uint32_t n = uint32_t(d.text.size());
      f.write(reinterpret_cast<const char*>(&n), 4);
      f.write(d.text.data(), std::streamsize(n));
    }
  }
  for (const auto& name : names) {
    auto tok = nk::load_tokenizer(name);
    std::vector<int32_t> ids;
    double best = 1e30, cold = 0;
    size_t tokens = 0;
    // The first pass (cold: empty piece cache) is reported on its own; the
    // best of the next `reps` passes is the warm figure.
    for (int r = 0; r < reps + 1; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      tokens = 0;
      for (const auto& d : docs) {
        ids.clear();
        tok->encode(d.text, ids);
        tokens += ids.size();
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r == 0) cold = s;
      if (r > 0 && s < best) best = s;
    }
    std::printf(
        "{\"impl\": \"nekton\", \"encoding\": \"%s\", \"docs\": %zu, \"bytes\": %zu, "
        "\"tokens\": %zu, \"seconds\": %.4f, \"MB_per_s\": %.2f, \"cold_MB_per_s\": %.2f}\n",
        name.c_str(), docs.size(), bytes, tokens, best, double(bytes) / best / 1e6,
        double(bytes) / cold / 1e6);
  }
}
