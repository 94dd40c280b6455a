// Hugging Face tokenizer.json files of SentencePiece-style BPE (Llama 2 /
// Mistral, Phi-3's Metaspace, Gemma 2/3): a SentencePiece BPE model is
// trained here (Debian's libsentencepiece) on the BPE parity corpus, converted
// by ref/hf_tokenizers.js the way transformers' convert_slow_tokenizer does,
// and Nekton's ids and decoded text must equal @huggingface/tokenizers' on
// every document. What the JavaScript reference does not implement as the
// Rust tokenizers (which transformers runs) do, Metaspace's split and its
// decoder, Split's behaviours, ByteFallback on an invalid byte run, fuse_unk
// and the unk order, is checked on small hand-made files. Then the loader's
// choice of file, and every bad input naming the file and the JSON path.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/tokenizer/bpe_corpus.h"
#include "data/tokenizer/hf_reference.h"
#include "data/tokenizer/hf_spm_json.h"
#include "data/tokenizer/sentencepiece_tokenizer.h"
#include "data/tokenizer/spm_bpe_tokenizer.h"
#include "data/tokenizer/tokenizer.h"
#include "data/utf8.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::contains;
using test::error_of;
using testing::CorpusDoc;
using namespace hf_reference;

const std::vector<std::string> kUserSymbols = {"<start_of_turn>", "<end_of_turn>"};

// The SentencePiece model trained once per process, its pieces dumped as the
// converter's input ("piece\tscore\ttype" lines).
const std::string& pieces_tsv() {
  static const std::string path = [] {
    const fs::path train = work() / "spm_train.txt";
    {
      std::ofstream f(train, std::ios::binary);
      // Every other document, line by line (SentencePiece reads lines): the
      // rest of the corpus has text the model never saw.
      for (const CorpusDoc& d : corpus(2, false)) {
        std::istringstream lines(replace_invalid_utf8(d.text));
        for (std::string l; std::getline(lines, l);)
          if (!l.empty() && l.size() < 4000) f << l << '\n';
      }
    }
    SentencePieceTrainOptions o;
    o.inputs = {train.string()};
    o.vocab_size = 3000;
    o.character_coverage = 0.995;  // rare characters fall back to bytes
    o.user_defined_symbols = kUserSymbols;
    o.num_threads = 1;  // the same model every run, however threads are scheduled
    const std::string model = work() / "spm.model";
    test::write_file(model, train_sentencepiece(o));
    const std::string tsv = work() / "spm_pieces.tsv";
    write_spm_pieces(model, tsv, kUserSymbols);
    return tsv;
  }();
  return path;
}

std::string spm_dir(const std::string& style) {
  return spm_folder(style, pieces_tsv(), work() / ("spm_" + style));
}

// The reference's ids and decoded text of each document.
struct Reference {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> text;
};

Reference reference(const std::string& dir, const std::vector<CorpusDoc>& docs) {
  const std::string in = work() / "spm_docs.in", out = work() / "spm_docs.out";
  {
    std::ofstream f(in, std::ios::binary);
    for (const auto& d : docs) {
      uint32_t n = uint32_t(d.text.size());
      f.write(reinterpret_cast<const char*>(&n), 4);
      f.write(d.text.data(), std::streamsize(d.text.size()));
    }
  }
  node("encode_decode '" + dir + "' '" + in + "' '" + out + "'");
  Reference r;
  std::istringstream lines(test::read_file(out));
  for (std::string ids, text; std::getline(lines, ids) && std::getline(lines, text);) {
    std::istringstream words(ids);
    r.ids.emplace_back(std::istream_iterator<int32_t>(words), std::istream_iterator<int32_t>());
    r.text.push_back(json::parse(text).get<std::string>());
  }
  return r;
}

std::vector<CorpusDoc> spm_docs() {
  std::vector<CorpusDoc> docs = corpus(1, false);
  for (CorpusDoc& d : extra_docs({"<s>", "</s>", "<unk>", "<start_of_turn>", "<end_of_turn>"}))
    docs.push_back(std::move(d));
  docs.push_back({"leading", "   three leading spaces, two trailing  "});
  docs.push_back({"one space", " "});
  docs.push_back({"metaspace", "\u2581 the meta-space itself \u2581\u2581x"});
  docs.push_back({"turns",
                  "<start_of_turn>user\nWie geht's?<end_of_turn>\n<start_of_turn>model\n"
                  "\u4e16\u754c \U0001F600<end_of_turn>"});
  docs.push_back({"starts with special", "<s> Hello</s><s>again"});
  docs.push_back({"newlines", "\n\nline one\n  line two\r\n\tend\n"});
  docs.push_back({"rare", "\u16A0\u16A2\u16A6 \U0001D518\U0001D52B \u0F00 \uA000 \U0001F9EC"});
  return docs;
}

void expect_spm_parity(const std::string& style) {
  REQUIRE_REFERENCE();
  const std::string dir = spm_dir(style);
  auto tok = load_tokenizer(dir);
  ASSERT_EQ(tok->kind(), "spm_bpe");
  const std::vector<CorpusDoc> docs = spm_docs();
  const Reference want = reference(dir, docs);
  ASSERT_EQ(want.ids.size(), docs.size());
  size_t bad = 0, tokens = 0, bytes = 0, byte_pieces = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int32_t> got;
    tok->encode_with_specials(docs[d].text, got);
    tokens += got.size(), bytes += docs[d].text.size();
    for (int32_t id : got)
      byte_pieces += tok->token_bytes(id).size() == 1 && uint8_t(tok->token_bytes(id)[0]) >= 0x80;
    EXPECT_EQ(tok->decode(want.ids[d]), want.text[d]) << style << " " << docs[d].name;
    if (got == want.ids[d]) continue;
    size_t at = 0;
    while (at < got.size() && at < want.ids[d].size() && got[at] == want.ids[d][at]) ++at;
    if (++bad <= 5)
      ADD_FAILURE() << style << " on " << docs[d].name << ": first difference at token " << at
                    << "\n  ours:" << show(*tok, got, at)
                    << "\n  ref: " << show(*tok, want.ids[d], at);
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << docs.size() << " documents differ";
  EXPECT_GT(byte_pieces, 100u) << "the corpus should need byte fallback";
  std::printf("[ parity  ] %s vs @huggingface/tokenizers: %zu documents, %zu bytes, %zu tokens\n",
              dir.c_str(), docs.size(), bytes, tokens);
}

TEST(HfSpmJson, LlamaLegacyStyleMatchesHuggingFace) {
  expect_spm_parity("llama");
}
TEST(HfSpmJson, MetaspaceStyleMatchesHuggingFace) {
  expect_spm_parity("metaspace");
}
TEST(HfSpmJson, GemmaStyleMatchesHuggingFace) {
  expect_spm_parity("gemma");
}

TEST(HfSpmJson, SpecialsAndLoaderChoice) {
  REQUIRE_REFERENCE();
  const std::string dir = spm_dir("llama");
  auto tok = load_tokenizer(dir);
  EXPECT_EQ(tok->token_bytes(tok->bos_id()), "<s>");
  EXPECT_EQ(tok->token_bytes(tok->eod_id()), "</s>");
  // The folder's tokenizer.json, and the same read as a file.
  EXPECT_EQ(load_tokenizer(dir + "/tokenizer.json")->encode("Hello world"),
            tok->encode("Hello world"));
  // Beside a tokenizer.model the SentencePiece model is what is read.
  const fs::path both = work() / "spm_both";
  fs::create_directories(both);
  fs::copy_file(fs::path(dir) / "tokenizer.json", both / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  fs::copy_file(work() / "spm.model", both / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  EXPECT_EQ(load_tokenizer(both.string())->kind(), "sentencepiece");
  // Stored with a model, it reopens as itself.
  const fs::path model = work() / "spm_model_dir";
  fs::create_directories(model);
  store_tokenizer(dir, model.string());
  auto again = load_tokenizer(stored_tokenizer(model.string()));
  EXPECT_EQ(again->kind(), "spm_bpe");
  EXPECT_EQ(again->encode("Grüße, 世界"), tok->encode("Grüße, 世界"));
}

// A small hand-made tokenizer.json: pieces by id, merges "a b", options merged in.
json small(const std::vector<std::string>& pieces, const std::vector<std::string>& merges,
           const json& extra = json::object()) {
  json vocab = json::object();
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = i;
  json j = {{"version", "1.0"},
            {"added_tokens", json::array()},
            {"normalizer", nullptr},
            {"pre_tokenizer", nullptr},
            {"decoder", nullptr},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", "<unk>"},
              {"fuse_unk", false},
              {"byte_fallback", true},
              {"vocab", vocab},
              {"merges", merges}}}};
  j.merge_patch(extra);
  return j;
}

std::unique_ptr<SpmBpeTokenizer> open_small(const json& j) {
  return std::make_unique<SpmBpeTokenizer>(hf_spm_bpe_spec(j, "small.json"));
}

const std::vector<std::string> kSpaces = {"<unk>",   "\u2581",  "a",           "b",
                                          "\u2581a", "\u2581b", "\u2581\u2581"};

json metaspace(const char* prepend, bool split) {
  return {{"pre_tokenizer",
           {{"type", "Metaspace"},
            {"replacement", "\u2581"},
            {"prepend_scheme", prepend},
            {"split", split}}}};
}

// Hugging Face (Rust) splits before each "▁" with split true; the JavaScript
// reference never splits.
TEST(HfSpmJson, MetaspaceSplitAndPrependScheme) {
  const std::vector<std::string> merges = {"\u2581 \u2581", "\u2581 a", "\u2581 b"};
  auto whole = open_small(small(kSpaces, merges, metaspace("always", false)));
  auto split = open_small(small(kSpaces, merges, metaspace("always", true)));
  EXPECT_EQ(whole->encode("a  b"), (std::vector<int32_t>{4, 6, 3}));
  EXPECT_EQ(split->encode("a  b"), (std::vector<int32_t>{4, 1, 5}));
  // prepend_scheme: first only for the run at the start of the text.
  json added = {{"added_tokens",
                 {{{"id", 7}, {"content", "<s>"}, {"normalized", false}, {"special", true}}}}};
  auto pieces = kSpaces;
  pieces.push_back("<s>");
  json first = small(pieces, merges, metaspace("first", false)), always = first, never = first;
  first.merge_patch(added);
  always.merge_patch(metaspace("always", false)), always.merge_patch(added);
  never.merge_patch(metaspace("never", false)), never.merge_patch(added);
  std::vector<int32_t> ids;
  open_small(first)->encode_with_specials("a<s>a", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{4, 7, 2}));
  ids.clear();
  open_small(always)->encode_with_specials("a<s>a", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{4, 7, 4}));
  ids.clear();
  open_small(never)->encode_with_specials("a<s>a", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 7, 2}));
}

TEST(HfSpmJson, DecodersAsRustTokenizers) {
  // Metaspace's decoder drops every "▁" of the first token (Rust's; the
  // JavaScript one strips one leading space), and keeps them with "never".
  json d = {{"decoder",
             {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}}}};
  EXPECT_EQ(open_small(small(kSpaces, {}, d))->decode(std::vector<int32_t>{6, 4, 1}), " a ");
  d["decoder"]["prepend_scheme"] = "never";
  EXPECT_EQ(open_small(small(kSpaces, {}, d))->decode(std::vector<int32_t>{6, 4, 1}), "   a ");
  // ByteFallback: a run of byte pieces that is not UTF-8 is U+FFFD per byte
  // (Rust's; JavaScript's TextDecoder gives one per maximal subpart).
  std::vector<std::string> pieces = {"<unk>", "a"};
  for (int b = 0; b < 256; ++b) pieces.push_back(fmt::format("<0x{:02X}>", b));
  json seq = {{"decoder",
               {{"type", "Sequence"},
                {"decoders",
                 {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                  {{"type", "ByteFallback"}},
                  {{"type", "Fuse"}},
                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}}}}}}};
  auto t = open_small(small(pieces, {}, seq));
  auto byte = [](int b) { return int32_t(2 + b); };
  EXPECT_EQ(t->decode(std::vector<int32_t>{byte(0xE4), byte(0xB8), 1}), "\uFFFD\uFFFDa");
  EXPECT_EQ(t->decode(std::vector<int32_t>{byte(0xE4), byte(0xB8), byte(0x96), 1}), "\u4e16a");
  // Strip: one space off each end of the fused text.
  EXPECT_EQ(t->decode(std::vector<int32_t>{byte(' '), byte(' '), 1, byte(' ')}), " a");
  EXPECT_EQ(t->encode("a\u4e16"), (std::vector<int32_t>{1, byte(0xE4), byte(0xB8), byte(0x96)}));
  EXPECT_EQ(t->token_bytes(byte(0xE4)), "\xE4");
}

TEST(HfSpmJson, UnknownCharactersAndIgnoreMerges) {
  // No byte pieces: unknown characters become <unk>, a run one with fuse_unk.
  json j = small({"<unk>", "a", "b", "ab"}, {"a b"}, {{"model", {{"byte_fallback", false}}}});
  EXPECT_EQ(open_small(j)->encode("axyb"), (std::vector<int32_t>{1, 0, 0, 2}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(open_small(j)->encode("axyab"), (std::vector<int32_t>{1, 0, 3}));
  // With byte fallback and some bytes missing: Hugging Face adds a pending
  // unk after the byte pieces that follow it.
  j = small({"<unk>", "a", "<0xC3>", "<0xA9>"}, {}, {{"model", {{"fuse_unk", true}}}});
  EXPECT_EQ(open_small(j)->encode("\u4e16\u00e9a"), (std::vector<int32_t>{2, 3, 0, 1}));
  // ignore_merges: a word that is a piece is that piece, merges or not.
  j = small({"<unk>", "a", "b", "c", "ab", "bc", "abc"}, {"b c", "a bc"});
  EXPECT_EQ(open_small(j)->encode("abc"), (std::vector<int32_t>{6}));
  j = small({"<unk>", "a", "b", "c", "ab", "bc", "abc", "x"}, {"a b", "b c"});
  EXPECT_EQ(open_small(j)->encode("abc"), (std::vector<int32_t>{4, 3}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(open_small(j)->encode("abc"), (std::vector<int32_t>{6}));
}

// An added token that is a model piece too (Gemma adds runs of "▁" and of
// newlines) is a piece merges make, as in Hugging Face's BPE model; matched
// as written (normalized false) it is never found in text with spaces.
TEST(HfSpmJson, AddedTokenThatIsAPieceIsMerged) {
  json j = small(
      {"<unk>", "a", "b", "\u2581", "\u2581\u2581"}, {"\u2581 \u2581"},
      {{"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}},
       {"added_tokens",
        {{{"id", 4}, {"content", "\u2581\u2581"}, {"normalized", false}, {"special", false}}}}});
  auto t = open_small(j);
  EXPECT_EQ(t->encode("a  b"), (std::vector<int32_t>{1, 4, 2}));
  std::vector<int32_t> ids;
  t->encode_with_specials("a  b\u2581\u2581", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 4, 2, 4}));
  EXPECT_EQ(t->token_bytes(4), "  ");  // as the decoder sees an added token too
}

TEST(HfSpmJson, SplitBehaviours) {
  const std::vector<std::string> pieces = {"<unk>", "a", "-", "a-", "-a"};
  const std::vector<std::string> merges = {"a -", "- a"};
  auto with = [&](const char* behavior) {
    return open_small(small(pieces, merges,
                            {{"pre_tokenizer",
                              {{"type", "Split"},
                               {"pattern", {{"String", "-"}}},
                               {"behavior", behavior},
                               {"invert", false}}}}))
        ->encode("-a-a");
  };
  EXPECT_EQ(with("MergedWithPrevious"), (std::vector<int32_t>{2, 3, 1}));
  EXPECT_EQ(with("MergedWithNext"), (std::vector<int32_t>{4, 4}));
  EXPECT_EQ(with("Isolated"), (std::vector<int32_t>{2, 1, 2, 1}));
  EXPECT_EQ(with("Removed"), (std::vector<int32_t>{1, 1}));
}

// Each bad input: the error names the file and the JSON path.
TEST(HfSpmJson, BadInputNamesFileAndJsonPath) {
  struct Case {
    json patch;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{{"normalizer",
         {{"type", "Sequence"},
          {"normalizers", {{{"type", "Prepend"}, {"prepend", "x"}}, {{"type", "Precompiled"}}}}}}},
       "normalizer.normalizers[1].type 'Precompiled'"},
      {{{"pre_tokenizer", {{"type", "Whitespace"}}}}, "pre_tokenizer.type 'Whitespace'"},
      {{{"pre_tokenizer", {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}}}},
       "pre_tokenizer.prepend_scheme is \"sometimes\""},
      {{{"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "ab"}}}},
       "pre_tokenizer.replacement must be one character"},
      {{{"pre_tokenizer", {{"type", "Metaspace"}, {"split", "yes"}}}},
       "pre_tokenizer.split must be true or false"},
      {{{"pre_tokenizer",
         {{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Isolated"}}}},
       "pre_tokenizer.pattern must be {\"String\""},
      {{{"pre_tokenizer",
         {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Contiguous"}}}},
       "pre_tokenizer.behavior is \"Contiguous\""},
      {{{"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}}}}}}},
       "pre_tokenizer.pretokenizers[0].type 'Digits'"},
      {{{"decoder",
         {{"type", "Sequence"},
          {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}, {{"type", "CTC"}}}}}}},
       "decoder.decoders[2].type 'CTC'"},
      {{{"decoder", {{"type", "Strip"}, {"content", "  "}, {"start", 1}, {"stop", 0}}}},
       "decoder.content must be one character"},
      {{{"decoder", {{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}}}},
       "decoder.start"},
      {{{"decoder", {{"type", "Replace"}, {"pattern", {{"Regex", "x"}}}, {"content", " "}}}},
       "decoder.pattern must be {\"String\""},
      {{{"model", {{"unk_token", "<missing>"}}}}, "model.unk_token '<missing>'"},
      {{{"model", {{"dropout", 0.1}}}}, "model.dropout is 0.1"},
      {{{"model", {{"type", "Unigram"}}}}, "model.type is \"Unigram\""},
      {{{"model", {{"fuse_unk", 1}}}}, "model.fuse_unk must be true or false"},
      {{{"model", {{"merges", {"a zz"}}}}}, "model.merges[0] ('a zz'): 'zz' is not in model.vocab"},
      {{{"model", {{"merges", {"a b c"}}}}}, "model.merges[0] must be"},
      {{{"added_tokens", {{{"id", 1}, {"content", "<x>"}, {"lstrip", true}}}}},
       "added_tokens[0].lstrip is true"},
  };
  for (const Case& c : cases) {
    const json j = small({"<unk>", "a", "b", "ab"}, {"a b"}, c.patch);
    const std::string e = error_of([&] { open_small(j); });
    EXPECT_TRUE(contains(e, "small.json: ")) << e;
    EXPECT_TRUE(contains(e, c.want)) << "want '" << c.want << "' in: " << e;
  }
  // Through the loader: the file's path is named.
  const fs::path dir = work() / "spm_bad";
  fs::create_directories(dir);
  test::write_file((dir / "tokenizer.json").string(),
                   small({"<unk>", "a"}, {}, {{"decoder", {{"type", "WordPiece"}}}}).dump());
  const std::string e = error_of([&] { load_tokenizer(dir.string()); });
  EXPECT_TRUE(contains(e, (dir / "tokenizer.json").string() + ": decoder.type 'WordPiece'")) << e;
}

}  // namespace
}  // namespace nk
