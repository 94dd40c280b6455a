// Single-thread MinHash signature throughput on real English text (GCIDE, the
// dictionary dictd ships; dictzip is gzip-compatible).
//   bench_minhash [--file PATH] [--mb N] [--doc-bytes N] [--reps N]
// Prints one JSON line per configuration: the fast path (AVX-512 where the
// build has it) and the scalar reference, for presets nemo and fineweb.
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "curate/dedup/minhash.h"

namespace {

std::string read_gz(const std::string& path, size_t limit) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    std::fprintf(stderr, "cannot open %s\n", path.c_str());
    std::exit(1);
  }
  std::string out;
  std::vector<char> buf(1 << 20);
  int n;
  while (out.size() < limit && (n = gzread(f, buf.data(), unsigned(buf.size()))) > 0)
    out.append(buf.data(), size_t(n));
  gzclose(f);
  if (out.size() > limit) out.resize(limit);
  return out;
}

// Documents of about `doc_bytes`, cut at line ends.
std::vector<std::string> split_docs(const std::string& text, size_t doc_bytes) {
  std::vector<std::string> docs;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = std::min(text.size(), at + doc_bytes);
    size_t nl = text.find('\n', end);
    end = nl == std::string::npos ? text.size() : nl + 1;
    docs.push_back(text.substr(at, end - at));
    at = end;
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = "/usr/share/dictd/gcide.dict.dz";
  size_t mb = 40, doc_bytes = 4096;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--file"))
      path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--mb"))
      mb = size_t(std::atol(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--doc-bytes"))
      doc_bytes = size_t(std::atol(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
  }
  std::vector<std::string> docs = split_docs(read_gz(path, mb << 20), doc_bytes);
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();

  for (const char* preset : {"nemo", "fineweb"}) {
    nk::curate::MinHashParams p;
    nk::curate::minhash_preset(preset, p);
    nk::curate::MinHasher h(p);
    std::vector<uint32_t> sig(size_t(h.num_hashes())), sh;
    for (const char* path_kind : {"fast", "scalar"}) {
      bool fast = !std::strcmp(path_kind, "fast");
      double best = 1e30, shingle_s = 1e30;
      uint64_t check = 0;
      for (int r = 0; r < reps; ++r) {
        double t_sh = 0;
        auto t0 = std::chrono::steady_clock::now();
        check = 0;
        for (const auto& d : docs) {
          auto a = std::chrono::steady_clock::now();
          sh.clear();
          h.shingles(d, sh);
          t_sh += std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
          if (fast)
            h.signature(sh.data(), sh.size(), sig.data());
          else
            h.signature_scalar(sh.data(), sh.size(), sig.data());
          check += sig[0] ^ sig[size_t(h.num_hashes()) - 1];
        }
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s < best) best = s, shingle_s = t_sh;
      }
      std::printf(
          "{\"bench\": \"minhash\", \"preset\": \"%s\", \"path\": \"%s\", \"hashes\": %d, "
          "\"threads\": 1, \"docs\": %zu, \"bytes\": %zu, \"seconds\": %.3f, \"mb_per_s\": %.1f, "
          "\"shingling_share\": %.2f, \"check\": %llu}\n",
          preset, path_kind, h.num_hashes(), docs.size(), bytes, best, bytes / best / 1e6,
          shingle_s / best, (unsigned long long)check);
      std::fflush(stdout);
    }
  }
  return 0;
}
