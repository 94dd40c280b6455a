// A SentencePiece-style BPE tokenizer.json (Llama 2 / Mistral legacy,
// Metaspace as Phi-3, Gemma) exported as GGUF's "llama" tokenizer: the pieces,
// types and scores derived from the merge ranks, read back as the SentencePiece
// model that `nekton import` of the GGUF (and llama.cpp's SentencePiece
// tokenizer) runs, encode every document of the parity corpus to the ids the
// tokenizer.json gives. Shapes SentencePiece cannot express are refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "ckpt/gguf_reader.h"
#include "ckpt/gguf_tokenizer.h"
#include "ckpt/gguf_vocab.h"
#include "ckpt/gguf_writer.h"
#include "ckpt/hf_io.h"
#include "data/tokenizer/hf_reference.h"
#include "data/tokenizer/hf_spm_json.h"
#include "data/tokenizer/sentencepiece_tokenizer.h"
#include "data/utf8.h"
#include "gguf_test_util.h"
#include "hf_test_util.h"
#include "test_paths.h"

namespace nk {
namespace {

using namespace hf_reference;

// A SentencePiece BPE trained once per process on every third document of
// the parity corpus; its pieces as ref/hf_tokenizers.js's spm command reads them.
const std::string& pieces_tsv() {
  static const std::string tsv = [] {
    const std::string train = work() / "gguf_spm_train.txt", model = work() / "gguf_spm.model",
                      out = work() / "gguf_spm.tsv";
    std::string lines;
    for (const testing::CorpusDoc& d : corpus(3, false)) {
      std::istringstream in(replace_invalid_utf8(d.text));
      for (std::string l; std::getline(in, l);)
        if (!l.empty() && l.size() < 4000) lines += l + "\n";
    }
    test::write_file(train, lines);
    SentencePieceTrainOptions o;
    o.inputs = {train};
    o.vocab_size = 1500;
    o.character_coverage = 0.995;
    o.num_threads = 1;
    test::write_file(model, train_sentencepiece(o));
    write_spm_pieces(model, out);
    return out;
  }();
  return tsv;
}

TEST(GgufSpmBpe, TokenizerJsonKeepsItsIdsThroughGguf) {
  REQUIRE_REFERENCE();
  const std::string tsv = pieces_tsv();
  std::vector<testing::CorpusDoc> docs;
  for (testing::CorpusDoc& d : corpus(2, false))
    if (find_invalid_utf8(d.text) < 0)
      docs.push_back(std::move(d));  // SentencePiece repairs
                                     // invalid bytes its own way
  for (const std::string style : {"llama", "metaspace", "gemma"}) {
    SCOPED_TRACE(style);
    auto tok = load_tokenizer(spm_folder(style, tsv, work() / ("gguf_" + style)));
    ASSERT_EQ(tok->kind(), "spm_bpe");
    const GgufVocab v = gguf_vocab(*tok, tok->vocab_size() + 8);  // 8 padding rows
    EXPECT_EQ(v.model, "llama");
    EXPECT_EQ(v.add_space_prefix, style != "gemma");
    EXPECT_EQ(v.types[0], kTokUnknown);
    EXPECT_EQ(v.types[1], kTokControl);  // <s>
    EXPECT_EQ(v.types[size_t(tok->vocab_size())], kTokUnused);
    GgufWriter w;
    add_gguf_vocab(w, v);
    const std::string path = work() / ("gguf_" + style + ".gguf");
    w.write(path);
    auto back = gguf_tokenizer(*GgufFile::open(path));
    EXPECT_EQ(back->bos_id(), tok->bos_id());
    EXPECT_EQ(back->eod_id(), tok->eod_id());
    size_t bad = 0, tokens = 0, leading = 0;
    for (const auto& d : docs) {
      // Metaspace puts no "▁" before a text that starts with a space (it has
      // one); SentencePiece and llama.cpp always add theirs. GGUF cannot say so.
      if (style == "metaspace" && d.text.starts_with(" ")) {
        ++leading;
        EXPECT_NE(back->encode(d.text), tok->encode(d.text));
        EXPECT_EQ(back->encode("x" + d.text), tok->encode("x" + d.text));
        continue;
      }
      const std::vector<int32_t> want = tok->encode(d.text), got = back->encode(d.text);
      tokens += want.size();
      if (got != want && ++bad <= 3) {
        size_t at = 0;
        while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
        ADD_FAILURE() << d.name << ": first difference at token " << at
                      << "\n  gguf:" << show(*back, got, at) << "\n  json:" << show(*tok, want, at);
      }
    }
    EXPECT_EQ(bad, 0u) << "of " << docs.size() << " documents";
    std::printf(
        "[ gguf    ] %s: %zu documents, %zu tokens through GGUF (%zu starting with a space "
        "left out)\n",
        style.c_str(), docs.size(), tokens, leading);
  }
}

// `nekton import` of a Hugging Face folder that has only the tokenizer.json
// records it (it was kept but unreadable before); export writes it back.
TEST(GgufSpmBpe, HfImportRecordsItAndExportWritesItBack) {
  REQUIRE_REFERENCE();
  const std::string src = spm_folder("gemma", pieces_tsv(), work() / "hf_gemma_tok");
  test::TempDir tmp("nk_hf_spm");
  nlohmann::json spec = test::llama_spec();
  spec["vocab"] = load_tokenizer(src)->vocab_size();
  const std::string hf = test::write_hf(tmp, "llama", spec);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(std::filesystem::path(src) / f, std::filesystem::path(hf) / f);
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.tokenizer_spec, "./tokenizer");
  auto tok = load_tokenizer(stored_tokenizer(tmp / "nk"));
  EXPECT_EQ(tok->kind(), "spm_bpe");
  const std::string text = "<start_of_turn>user\nGr\u00fc\u00dfe, \u4e16\u754c \U0001F600";
  std::vector<int32_t> a, b;
  tok->encode_with_specials(text, a);
  load_tokenizer(src)->encode_with_specials(text, b);
  EXPECT_EQ(a, b);
  export_hf(tmp / "nk", tmp / "back");
  EXPECT_EQ(test::read_file(tmp / "back/tokenizer.json"), test::read_file(src + "/tokenizer.json"));
}

// llama.cpp itself (node-llama-cpp's prebuilt CPU library, as
// gguf_llama_cpp_test.cc runs it) tokenizes text with the exported
// vocabulary as the tokenizer.json does, and spells it back.
TEST(GgufSpmBpe, LlamaCppTokenizesAsTheTokenizerJson) {
  REQUIRE_REFERENCE();
  const std::string modules = assets_dir() + "/llama-cpp/node_modules";
  NK_REQUIRE_ASSET(std::filesystem::exists(modules + "/node-llama-cpp/package.json") &&
                       std::filesystem::exists(modules + "/@node-llama-cpp/linux-x64"),
                   "node-llama-cpp (scripts/fetch_assets.sh --test)");
  const std::string text =
      "Gr\u00fc\u00dfe aus K\u00f6ln!  Two  spaces, \u4e16\u754c\u4f60\u597d, "
      "\u16A0\u16A2 \U0001F600 int main(void) { return 0; }\n\ttab";
  for (const std::string style : {"llama", "metaspace", "gemma"}) {
    SCOPED_TRACE(style);
    const std::string src = spm_folder(style, pieces_tsv(), work() / fmt::format("lc_{}", style));
    auto tok = load_tokenizer(src);
    const std::string model = work() / fmt::format("lc_model_{}", style),
                      gguf = fmt::format("{}.gguf", model), out = fmt::format("{}.json", model);
    test::save_tiny_model(model, test::tiny_llama(tok->vocab_size(), false), 5, src);
    test::RunResult r = test::run_nekton(fmt::format("export gguf {} {} --type f32", model, gguf));
    ASSERT_EQ(r.code, 0) << r.out;
    r = test::run_command(
        fmt::format("node {}/tests/ckpt/llama_cpp_eval.mjs {} {} 1,2,3 1 '{}' > {}", NK_SOURCE_DIR,
                    modules, gguf, text, out));
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string printed = test::read_file(out);
    ASSERT_FALSE(printed.empty()) << r.out;
    const auto j = nlohmann::json::parse(printed.substr(printed.rfind("\n{") + 1));
    const std::vector<int32_t> want = tok->encode(text);
    EXPECT_EQ(j["tokenized"].get<std::vector<int32_t>>(), want);
    EXPECT_EQ(j["detokenized"].get<std::string>(), text);
    std::printf("[llama.cpp] %s: %zu tokens as the tokenizer.json gives\n", style.c_str(),
                want.size());
  }
}

TEST(GgufSpmBpe, ShapesSentencePieceCannotExpressAreRefused) {
  nlohmann::json j = {{"model",
                       {{"type", "BPE"},
                        {"byte_fallback", true},
                        {"unk_token", "<unk>"},
                        {"vocab", {{"<unk>", 0}, {"a", 1}}},
                        {"merges", nlohmann::json::array()}}}};
  auto refused = [&](const nlohmann::json& patch) {
    nlohmann::json doc = j;
    doc.merge_patch(patch);
    SpmBpeTokenizer tok(hf_spm_bpe_spec(doc, "x/tokenizer.json"));
    return test::error_of([&] { gguf_vocab(tok, 2); });
  };
  EXPECT_TRUE(test::contains(refused({{"normalizer", {{"type", "NFC"}}}}),
                             "the SentencePiece-style tokenizer 'x/tokenizer.json' has the "
                             "normalizer {\"type\":\"NFC\"}"));
  EXPECT_TRUE(test::contains(refused({{"pre_tokenizer", {{"type", "Metaspace"}, {"split", true}}}}),
                             "Metaspace with split true"));
  EXPECT_TRUE(test::contains(refused(nlohmann::json::object()), "neither a normalizer nor"));
}

}  // namespace
}  // namespace nk
