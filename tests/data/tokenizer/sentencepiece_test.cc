// SentencePieceTokenizer against the reference: a Llama-style BPE model is
// trained here on multilingual text, then every line of a test corpus (scripts
// not seen in training, emoji, whitespace runs, code, invalid UTF-8) must get
// exactly the ids Debian's `spm_encode --output_format=id` gives for the same
// bytes, and decode must give what `spm_decode --input_format=id` gives.
#include "data/tokenizer/sentencepiece_tokenizer.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "data/dataset/text_dataset.h"
#include "data/tokenizer/tokenizer.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

using test::error_of;
using test::read_file;
using test::write_file;

// One folder per process (ctest runs the tests of this file in parallel
// processes), removed at exit.
const fs::path& dir() {
  static const test::TempDir d("nk_spm");
  return d.path();
}

// The first `n` bytes of a file (gzip or plain), "" if it is not there.
std::string head(const std::string& path, size_t n, size_t skip = 0) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return "";
  std::string s(skip + n, '\0');
  int got = gzread(f, s.data(), unsigned(s.size()));
  gzclose(f);
  s.resize(got > 0 ? size_t(got) : 0);
  s.erase(0, std::min(skip, s.size()));
  // Whole lines only, and without the fortune files' ANSI colour codes.
  if (size_t nl = s.rfind('\n'); nl != std::string::npos) s.resize(nl + 1);
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\x1b' && i + 1 < s.size() && s[i + 1] == '[') {
      while (i < s.size() && s[i] != 'm') ++i;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

const char* kFortunes = "/usr/share/games/fortunes/";

// A few lines per language, always present even without the fortune packages.
const char* kInline =
    "The quick brown fox jumps over the lazy dog.\n"
    "Zw\xc3\xb6lf Boxk\xc3\xa4mpfer jagen Viktor quer \xc3\xbc"
    "ber den gro\xc3\x9f"
    "en Sylter Deich.\n"
    "\xd0\xa1\xd1\x8a\xd0\xb5\xd1\x88\xd1\x8c \xd0\xb6\xd0\xb5 \xd0\xb5\xd1\x89\xd1\x91 "
    "\xd1\x8d\xd1\x82\xd0\xb8\xd1\x85 \xd0\xbc\xd1\x8f\xd0\xb3\xd0\xba\xd0\xb8\xd1\x85 "
    "\xd1\x84\xd1\x80\xd0\xb0\xd0\xbd\xd1\x86\xd1\x83\xd0\xb7\xd1\x81\xd0\xba\xd0\xb8\xd1\x85 "
    "\xd0\xb1\xd1\x83\xd0\xbb\xd0\xbe\xd0\xba.\n"
    "\xe5\xba\x8a\xe5\x89\x8d\xe6\x98\x8e\xe6\x9c\x88\xe5\x85\x89\xef\xbc\x8c\xe7\x96\x91\xe6"
    "\x98\xaf\xe5\x9c\xb0\xe4\xb8\x8a\xe9\x9c\x9c\xe3\x80\x82\n"
    "int main(int argc, char** argv) { return argc > 1 ? 0 : 1; }\n";

std::string training_text() {
  std::string t = head("/usr/share/dictd/gcide.dict.dz", 250000);
  t += head(std::string(kFortunes) + "de/witze", 70000);
  t += head(std::string(kFortunes) + "ru/life", 70000);
  t += head(std::string(kFortunes) + "tang300", 30000);
  for (int i = 0; i < 20; ++i) t += kInline;
  return t;
}

// Lines the model is tested on: text it saw, text it did not, and the cases
// that stress a tokenizer. No '\n' inside a line (spm_encode reads lines).
std::vector<std::string> test_lines() {
  std::vector<std::string> lines = {
      "",
      "Hello, world!",
      "   leading spaces and trailing spaces   ",
      "runs  of   spaces\t\ttabs \t mixed",
      " ",
      "\t",
      "a\rb carriage return",
      "for (int i = 0; i < n; ++i) { sum += x[i] * 2; }  // comment",
      "def f(x):    return {'k': [1, 2, 3]}",
      "<s> and </s> and <unk> are text here",
      "digits 1234567890 3.14159 1e-9 0x7fff",
      "https://example.com/path?query=1&b=%20",
      "caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 e\xcc\x81 (combining)",
      "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd family "
      "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 flag "
      "\xf0\x9f\x87\xa9\xf0\x9f\x87\xaa",
      // Japanese, Korean, Arabic, Hindi, math letters: not in the training text.
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9"
      "\xe3\x83\x88",
      "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xed\x85\x8d\xec\x8a\xa4\xed\x8a\xb8",
      "\xd8\xa7\xd9\x84\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a\xd8\xa9",
      "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80",
      "\xf0\x9d\x94\x98\xf0\x9d\x94\xab\xf0\x9d\x94\xa6",
      "\xe2\x96\x81 the meta-space character itself \xe2\x96\x81\xe2\x96\x81",
      "U+FFFD \xef\xbf\xbd replacement",
      std::string("nul \0 byte", 10),
      "\x01\x02\x7f controls",
      // Invalid UTF-8: stray bytes, truncated sequences, overlong forms,
      // surrogates, code points past U+10FFFF.
      "\xff",
      "abc\x80"
      "def",
      "\xc3(",
      "\xe2\x82 truncated",
      "\xf0\x9f\x98 truncated emoji",
      "\xed\xa0\x80 surrogate",
      "\xc0\xaf overlong",
      "\xf4\x90\x80\x80 too big",
      "\xfe\xfe\xff\xff",
      "mixed \xd0\xbf\xd1\x80\xd0\xb8\x80\xd0\xb2\xd0\xb5\xd1\x82 bad",
  };
  // Text seen in training and text that was not (further into the same files).
  for (auto* s : {"/usr/share/dictd/gcide.dict.dz", "de/witze", "ru/life", "tang300", "de/zitate",
                  "ru/work", "song100", "chinese"}) {
    std::string path = s[0] == '/' ? std::string(s) : std::string(kFortunes) + s;
    for (size_t skip : {size_t(0), size_t(400000)}) {
      std::istringstream in(head(path, 6000, skip));
      int n = 0;
      for (std::string line; std::getline(in, line) && n < 40; ++n) lines.push_back(line);
    }
  }
  return lines;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::istringstream in(s);
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

class SentencePiece : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    corpus_ = (dir() / "train.txt").string();
    model_ = (dir() / "llama_style.model").string();
    write_file(corpus_, training_text());
    SentencePieceTrainOptions o;
    o.inputs = {corpus_};
    o.vocab_size = 4000;
    o.num_threads = 2;
    std::string bytes = train_sentencepiece(o);
    write_file(model_, bytes);
  }
  static std::string corpus_, model_;
};
std::string SentencePiece::corpus_, SentencePiece::model_;

TEST_F(SentencePiece, LlamaStyleModel) {
  auto tok = SentencePieceTokenizer::open(model_);
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->model_type(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 4000);
  EXPECT_EQ(tok->unk_id(), 0);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eod_id(), 2);
  auto specials = tok->special_tokens();
  ASSERT_EQ(specials.size(), 3u);
  EXPECT_EQ(specials[0], (std::pair<std::string, int32_t>("<unk>", 0)));
  EXPECT_EQ(specials[1], (std::pair<std::string, int32_t>("<s>", 1)));
  EXPECT_EQ(specials[2], (std::pair<std::string, int32_t>("</s>", 2)));
  // Byte fallback: ids 3..258 are <0x00>..<0xFF>, and token_bytes maps them.
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(tok->piece(3 + b), fmt::format("<0x{:02X}>", b));
    EXPECT_EQ(tok->token_bytes(3 + b), std::string(1, char(b)));
  }
  EXPECT_EQ(tok->token_bytes(1), "<s>");
  // The factory opens .model files.
  auto t2 = load_tokenizer(model_);
  EXPECT_EQ(t2->kind(), "sentencepiece");
  EXPECT_EQ(t2->vocab_size(), 4000);
  // Split digits: every digit is its own piece.
  auto ids = tok->encode("x 1234567890");
  std::string joined;
  for (int32_t id : ids) {
    std::string p = tok->token_bytes(id);
    if (p.find_first_of("0123456789") != std::string::npos) {
      EXPECT_EQ(p.size(), 1u) << p;
    }
    joined += p;
  }
  EXPECT_EQ(joined, " x 1234567890");  // the dummy prefix
}

TEST_F(SentencePiece, EncodeMatchesSpmEncodeAndDecodeMatchesSpmDecode) {
  auto tok = SentencePieceTokenizer::open(model_);
  std::vector<std::string> lines = test_lines();
  ASSERT_GT(lines.size(), 100u);
  std::string text;
  for (auto& l : lines) text += l + "\n";
  fs::path in = dir() / "parity.txt";
  write_file(in, text);
  auto ref = test::run_command(
      "spm_encode --model " + model_ + " --output_format=id < " + in.string() + " 2>/dev/null",
      false);
  ASSERT_EQ(ref.code, 0) << "spm_encode (Debian package sentencepiece) failed";
  std::vector<std::string> ref_lines = split_lines(ref.out);
  ASSERT_EQ(ref_lines.size(), lines.size());
  std::string all_ids;
  int64_t tokens = 0, byte_pieces = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<int32_t> ours = tok->encode(lines[i]);
    ASSERT_EQ(ours, parse_ids(ref_lines[i])) << "line " << i << ": '" << lines[i] << "'";
    tokens += int64_t(ours.size());
    for (int32_t id : ours) byte_pieces += id >= 3 && id < 259;
    all_ids += fmt::format("{}\n", fmt::join(ours, " "));
  }
  EXPECT_GT(byte_pieces, 50) << "byte fallback exercised";
  EXPECT_GT(tokens, 2000);

  fs::path ids_file = dir() / "parity.ids";
  write_file(ids_file, all_ids);
  auto dec = test::run_command(
      "spm_decode --model " + model_ + " --input_format=id < " + ids_file.string() + " 2>/dev/null",
      false);
  ASSERT_EQ(dec.code, 0) << "spm_decode failed";
  std::vector<std::string> dec_lines = split_lines(dec.out);
  ASSERT_EQ(dec_lines.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i)
    ASSERT_EQ(tok->decode(parse_ids(ref_lines[i])), dec_lines[i]) << "line " << i;
}

TEST_F(SentencePiece, InvalidUtf8BecomesOneReplacementPerByte) {
  auto tok = SentencePieceTokenizer::open(model_);
  // As SentencePiece's normalizer: each invalid byte is one U+FFFD.
  EXPECT_EQ(tok->decode(tok->encode("a\xff\xfe"
                                    "b")),
            "a\xef\xbf\xbd\xef\xbf\xbd"
            "b");
  EXPECT_EQ(tok->encode("\xe2\x82"), tok->encode("\xef\xbf\xbd\xef\xbf\xbd"));
}

TEST_F(SentencePiece, RoundTripsValidText) {
  auto tok = SentencePieceTokenizer::open(model_);
  std::string doc;
  // SentencePiece's one lossy case for valid text: "▁" itself decodes to " ".
  const std::string meta = "\xe2\x96\x81";
  for (auto& l : test_lines())
    if (l.find('\0') == std::string::npos && find_invalid_utf8(l) < 0 &&
        l.find(meta) == std::string::npos)
      doc += l + "\n";
  // A whole multi-line document, with newlines (byte fallback <0x0A>).
  ASSERT_GT(doc.size(), 10000u);
  std::vector<int32_t> ids = tok->encode(doc);
  EXPECT_TRUE(tok->decode(ids) == doc);
  std::string bytes;
  for (int32_t id : ids) bytes += tok->token_bytes(id);
  EXPECT_TRUE(bytes == " " + doc) << "token_bytes concatenate to the text after the dummy prefix";
  EXPECT_EQ(tok->decode(tok->encode("a" + meta + "b")), "a b");
  for (const char* s :
       {" leading space", "  two", "trailing  ", "\n", "a\n\nb", "\xf0\x9f\x98\x80"})
    EXPECT_EQ(tok->decode(tok->encode(s)), s) << s;
  // encode appends; encode_with_specials maps <s> and </s> to their ids.
  std::vector<int32_t> out = {7};
  tok->encode("hi", out);
  EXPECT_EQ(out.size(), 1 + tok->encode("hi").size());
  std::vector<int32_t> sp;
  tok->encode_with_specials("<s>hi</s>", sp);
  std::vector<int32_t> want = {1};
  tok->encode("hi", want);
  want.push_back(2);
  EXPECT_EQ(sp, want);
  sp.clear();
  tok->encode_with_specials("a</s></s>b<unk><s", sp);
  want = tok->encode("a");
  want.insert(want.end(), {2, 2});
  tok->encode("b", want);
  want.push_back(0);
  tok->encode("<s", want);
  EXPECT_EQ(sp, want);
  EXPECT_NE(tok->encode("<s>").size(), 1u) << "encode treats <s> as text";
  // Control ids decode to nothing.
  EXPECT_EQ(tok->decode(std::vector<int32_t>{1, 2}), "");
}

TEST_F(SentencePiece, BadIdsAndFilesNameTheProblem) {
  auto tok = SentencePieceTokenizer::open(model_);
  std::string e = error_of([&] { tok->decode(std::vector<int32_t>{5, 4000}); });
  EXPECT_NE(e.find("4000 at position 1"), std::string::npos) << e;
  EXPECT_THROW(tok->decode(std::vector<int32_t>{-1}), Error);
  EXPECT_THROW(tok->token_bytes(4000), Error);

  auto expect_error = [](const std::string& path, const char* what) {
    std::string m = error_of([&] { load_tokenizer(path); });
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  };
  expect_error((dir() / "missing.model").string(), "cannot open");
  fs::path garbage = dir() / "garbage.model";
  write_file(garbage, "this is not a sentencepiece model\n");
  expect_error(garbage.string(), "not a valid SentencePiece model");
  fs::path empty = dir() / "empty.model";
  write_file(empty, "");
  expect_error(empty.string(), "empty");
  std::string bytes = read_file(model_);
  fs::path truncated = dir() / "truncated.model";
  write_file(truncated, bytes.substr(0, bytes.size() / 2 + 1));
  expect_error(truncated.string(), "not a valid SentencePiece model");
  fs::create_directories(dir() / "folder.model");
  expect_error((dir() / "folder.model").string(), "directory");
  // Found by tests/fuzz: a piece of zero length, which libsentencepiece's trie
  // throws on (an exception of its own, not a status) while loading.
  fs::path zero = dir() / "zero_length_piece.model";
  fs::copy_file(fs::path(NK_SOURCE_DIR) / "tests/fuzz/corpus/sentencepiece/zero_length_piece",
                zero);
  expect_error(zero.string(), "not a valid SentencePiece model");
}

TEST_F(SentencePiece, TrainingMatchesSpmTrain) {
  // spm_train with the same settings on the same file gives the same pieces.
  fs::path prefix = dir() / "spm_train";
  auto log =
      test::run_command("spm_train --input=" + corpus_ + " --model_prefix=" + prefix.string() +
                        " --vocab_size=4000 --model_type=bpe --byte_fallback=true"
                        " --split_digits=true --normalization_rule_name=identity"
                        " --remove_extra_whitespaces=false --add_dummy_prefix=true"
                        " --allow_whitespace_only_pieces=true --character_coverage=0.99995"
                        " --max_sentence_length=4192 --pad_id=-1 --num_threads=2");
  ASSERT_EQ(log.code, 0) << log.out;
  auto ref = SentencePieceTokenizer::open(prefix.string() + ".model");
  auto ours = SentencePieceTokenizer::open(model_);
  EXPECT_EQ(ours->vocab_text(), ref->vocab_text());
  EXPECT_EQ(ours->vocab_text(), read_file(prefix.string() + ".vocab"))
      << ".vocab format as spm_train";
}

TEST(SentencePieceTrain, BadInputsNameTheProblem) {
  SentencePieceTrainOptions o;
  o.inputs = {(dir() / "no_such_input.txt").string()};
  o.vocab_size = 300;
  std::string e = error_of([&] { train_sentencepiece(o); });
  EXPECT_NE(e.find("no_such_input.txt"), std::string::npos) << e;
  fs::path small = dir() / "small.txt";
  write_file(small, "tiny text\n");
  o.inputs = {small.string()};
  o.vocab_size = 100000;
  EXPECT_THROW(train_sentencepiece(o), Error);
}

}  // namespace
}  // namespace nk
