// Token-for-token parity of BpeTokenizer with the reference implementations,
// run here in Node: OpenAI's tiktoken (its Rust core compiled to WASM) for
// every encoding, and OpenAI's gpt-3-encoder (JavaScript) for GPT-2. Both get
// the same bytes, decoded by Node as UTF-8 (invalid bytes become U+FFFD).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/tokenizer/bpe_corpus.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_trainer.h"
#include "data/tokenizer/tokenizer.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using testing::CorpusDoc;

// One folder per process (ctest runs these tests in parallel processes),
// removed at exit.
const fs::path& work_dir() {
  static const test::TempDir d("nk_bpe_parity");
  return d.path();
}

bool have_node_and_assets() {
  return std::system("node --version > /dev/null 2>&1") == 0 &&
         fs::exists(fs::path(assets_dir()) / "npm/node_modules/tiktoken/package.json") &&
         fs::exists(fs::path(assets_dir()) / "npm/node_modules/gpt-3-encoder/Encoder.js");
}

// Runs tests/data/tokenizer/ref/encode.js on `docs`; the reference's ids per document.
std::vector<std::vector<int32_t>> reference_encode(const std::string& lib,
                                                   const std::string& encoding,
                                                   const std::vector<CorpusDoc>& docs) {
  fs::path dir = work_dir();
  std::string tag = lib + "_" + fs::path(encoding).filename().string();
  fs::path in = dir / (tag + ".in"), out = dir / (tag + ".out");
  {
    std::ofstream f(in, std::ios::binary);
    for (const auto& d : docs) {
      uint32_t n = uint32_t(d.text.size());
      f.write(reinterpret_cast<const char*>(&n), 4);
      f.write(d.text.data(), std::streamsize(d.text.size()));
    }
  }
  std::string cmd = "NEKTON_ASSETS='" + assets_dir() + "' node '" + std::string(NK_SOURCE_DIR) +
                    "/tests/data/tokenizer/ref/encode.js' " + lib + " " + encoding + " '" +
                    in.string() + "' '" + out.string() + "'";
  int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  std::ifstream f(out, std::ios::binary);
  std::vector<std::vector<int32_t>> ids;
  for (size_t i = 0; i < docs.size(); ++i) {
    uint32_t n = 0;
    if (!f.read(reinterpret_cast<char*>(&n), 4)) break;
    std::vector<int32_t> v(n);
    f.read(reinterpret_cast<char*>(v.data()), std::streamsize(4 * size_t(n)));
    ids.push_back(std::move(v));
  }
  fs::remove(in);
  fs::remove(out);
  return ids;
}

std::string show(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t at) {
  std::ostringstream s;
  size_t b = at > 6 ? at - 6 : 0, e = std::min(ids.size(), at + 6);
  for (size_t i = b; i < e; ++i) {
    std::string t;
    try {
      t = tok.token_bytes(ids[i]);
    } catch (...) {
      t = "?";
    }
    std::string esc;
    for (unsigned char c : t)
      esc += c >= 0x20 && c < 0x7F && c != '\\' ? std::string(1, char(c))
                                                : fmt::format("\\x{:02X}", c);
    s << (i == at ? " >>" : " ") << ids[i] << "'" << esc << "'";
  }
  return s.str();
}

// Compares every document; reports the first mismatches with context.
void expect_parity(const std::string& spec, const std::string& lib, const std::string& encoding,
                   const std::vector<CorpusDoc>& docs) {
  auto tok = load_tokenizer(spec);
  auto want = reference_encode(lib, encoding, docs);
  ASSERT_EQ(want.size(), docs.size()) << lib << " " << encoding << " did not encode every document";
  size_t bad = 0, tokens = 0, bytes = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int32_t> got = tok->encode(docs[d].text);
    tokens += got.size(), bytes += docs[d].text.size();
    if (got == want[d]) continue;
    size_t at = 0;
    while (at < got.size() && at < want[d].size() && got[at] == want[d][at]) ++at;
    if (++bad <= 5)
      ADD_FAILURE() << spec << " vs " << lib << " on document " << docs[d].name
                    << ": first difference at token " << at << " (ours " << got.size()
                    << " tokens, reference " << want[d].size()
                    << ")\n  ours:" << show(*tok, got, at)
                    << "\n  ref: " << show(*tok, want[d], at);
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << docs.size() << " documents differ";
  std::printf("[ parity  ] %s vs %s: %zu documents, %zu bytes, %zu tokens\n", spec.c_str(),
              lib.c_str(), docs.size(), bytes, tokens);
}

const std::vector<CorpusDoc>& corpus() {
  static const std::vector<CorpusDoc> docs = testing::bpe_corpus(192 << 10);
  return docs;
}

#define REQUIRE_REFERENCE() NK_REQUIRE_ASSET(have_node_and_assets(), "node or the npm references")

TEST(BpeParity, Gpt2VsTiktoken) {
  REQUIRE_REFERENCE();
  expect_parity("gpt2", "tiktoken", "gpt2", corpus());
}

TEST(BpeParity, R50kVsTiktoken) {
  REQUIRE_REFERENCE();
  expect_parity("r50k_base", "tiktoken", "r50k_base", corpus());
}

TEST(BpeParity, P50kVsTiktoken) {
  REQUIRE_REFERENCE();
  expect_parity("p50k_base", "tiktoken", "p50k_base", corpus());
}

TEST(BpeParity, Cl100kVsTiktoken) {
  REQUIRE_REFERENCE();
  expect_parity("cl100k_base", "tiktoken", "cl100k_base", corpus());
}

TEST(BpeParity, O200kVsTiktoken) {
  REQUIRE_REFERENCE();
  expect_parity("o200k_base", "tiktoken", "o200k_base", corpus());
}

// A vocabulary trained here on the multilingual corpus, saved as .tiktoken and
// loaded by the reference: the trainer's output is a real tiktoken vocabulary
// and our encoder agrees with tiktoken's on it.
TEST(BpeParity, TrainedVocabularyVsTiktoken) {
  REQUIRE_REFERENCE();
  std::vector<std::string_view> texts;
  for (size_t i = 0; i < corpus().size(); i += 2) texts.push_back(corpus()[i].text);
  BpeTrainOptions o;
  o.vocab_size = 3000;
  o.pattern = openai_pattern("o200k_base");
  BpeVocab v = train_bpe(count_pieces(texts, o.pattern, 2), o);
  ASSERT_EQ(int64_t(v.tokens.size() + v.specials.size()), o.vocab_size);
  fs::path dir = work_dir() / "trained";
  save_bpe_tokenizer(v, dir.string());
  expect_parity(dir.string(), "tiktoken-dir", dir.string(), corpus());
  // The same vocabulary reopened from encoder.json + vocab.bpe alone encodes the same.
  fs::path gpt2_dir = work_dir() / "trained_gpt2_files";
  fs::create_directories(gpt2_dir);
  for (const char* f : {"encoder.json", "vocab.bpe"})
    fs::copy_file(dir / f, gpt2_dir / f, fs::copy_options::overwrite_existing);
  BpeVocab from_gpt2 = load_bpe_dir(gpt2_dir.string());
  EXPECT_EQ(from_gpt2.tokens, v.tokens);
  fs::remove_all(dir);
  fs::remove_all(gpt2_dir);
}

TEST(BpeParity, Gpt2VsGpt3Encoder) {
  REQUIRE_REFERENCE();
  // gpt-3-encoder is plain JavaScript and slow: every third document. Its
  // regex is JavaScript's, whose \s differs from Unicode White_Space (which
  // tiktoken and we follow) on U+0085 (not space in JS) and U+FEFF (space in
  // JS): those two are taken out of the text it is compared on.
  std::vector<CorpusDoc> docs;
  for (size_t i = 0; i < corpus().size(); i += 3) {
    CorpusDoc d = corpus()[i];
    for (std::string_view cut : {"\xC2\x85", "\xEF\xBB\xBF"})
      for (size_t at; (at = d.text.find(cut)) != std::string::npos;) d.text.erase(at, cut.size());
    docs.push_back(std::move(d));
  }
  expect_parity("gpt2", "gpt-3-encoder", "gpt2", docs);
}

}  // namespace
}  // namespace nk
