// `nekton tokenizer info|encode|decode|train` end to end, on the byte tokenizer
// and on a SentencePiece model trained by the command itself, and every bad
// input: exit code 1, a message naming the argument or file, no output left.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <sstream>
#include <vector>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
namespace test = nk::test;
using test::contains;
using test::read_file;
using test::run_nekton;
using test::RunResult;
using test::write_file;

// A per-process folder (ctest runs these tests in parallel), removed at exit.
const fs::path& dir() {
  static const test::TempDir d("nk_tokenizer_cli");
  return d.path();
}

// ~150 KB of English from the GCIDE dictionary plus a little German and Russian.
fs::path corpus() {
  fs::path p = dir() / "corpus.txt";
  if (fs::exists(p)) return p;
  gzFile f = gzopen("/usr/share/dictd/gcide.dict.dz", "rb");
  std::string s(150000, '\0');
  int n = f ? gzread(f, s.data(), unsigned(s.size())) : 0;
  if (f) gzclose(f);
  s.resize(n > 0 ? size_t(n) : 0);
  s.resize(s.rfind('\n') + 1);
  for (int i = 0; i < 50; ++i)
    s += "Gr\xc3\xbc\xc3\x9f Gott, sch\xc3\xb6ne Stra\xc3\x9f"
         "e!\n\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1\x80!\n";
  write_file(p, s);
  return p;
}

// Trains once per process; the model the SentencePiece tests use.
const std::string& sp_model() {
  static std::string model = [] {
    fs::path out = dir() / "sp";
    RunResult r = run_nekton("tokenizer train --type sentencepiece --input " + corpus().string() +
                             " --vocab-size 600 --threads 2 --out " + out.string() + "/");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "600 tokens")) << r.out;
    return (out / "tokenizer.model").string();
  }();
  return model;
}

TEST(TokenizerCli, HelpAndUsage) {
  RunResult r = run_nekton("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "tokenizer")) << r.out;
  r = run_nekton("tokenizer --help");
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"info SPEC", "encode SPEC", "decode SPEC", "train --type"})
    EXPECT_TRUE(contains(r.out, s)) << s << "\n" << r.out;
  r = run_nekton("tokenizer encode --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "--ids-only"));
  r = run_nekton("tokenizer");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "usage: nekton tokenizer"));
}

// Every command with --options lists them with docs and names the nearest
// option for a misspelt one.
TEST(TokenizerCli, OptionsHaveDocsAndAMisspeltOneNamesTheNearest) {
  struct Case {
    const char* help;
    std::vector<const char*> lines;
  };
  for (const Case& c : std::vector<Case>{
           {"tokenizer info --help", {"tokenizer info options:", "--count INT", "(default 10)"}},
           {"tokenizer decode --help", {"--input STRING", "--output STRING"}},
           {"tokenizer train --help", {"--vocab-size INT", "--input STRING", "(one or more)"}},
           {"export gguf --help", {"--name STRING", "general.name", "--tokenizer STRING"}},
           {"import hf --help", {"--dtype STRING", "(default f32)", "--overwrite"}},
           {"curate train-classifier --help", {"--epoch INT", "(default 5)"}}}) {
    RunResult r = run_nekton(c.help);
    EXPECT_EQ(r.code, 0) << c.help << "\n" << r.out;
    for (const char* l : c.lines)
      EXPECT_TRUE(contains(r.out, l)) << c.help << ": " << l << "\n" << r.out;
  }
  RunResult r = run_nekton("tokenizer encode bytes --txt hi");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "tokenizer encode: unknown option '--txt' (did you mean '--text'?)"))
      << r.out;
  r = run_nekton("export gguf a b --nmae x");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "export gguf: unknown option '--nmae' (did you mean '--name'?)"))
      << r.out;
  // The old forms still work: --opt=value, flags, several values.
  r = run_nekton("tokenizer encode bytes --text=hi --ids-only");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "104 105\n");
}

TEST(TokenizerCli, ByteTokenizer) {
  RunResult r = run_nekton("tokenizer info bytes");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "kind:           bytes")) << r.out;
  EXPECT_TRUE(contains(r.out, "vocab size:     257")) << r.out;
  EXPECT_TRUE(contains(r.out, "eod id:         256 <|endoftext|>")) << r.out;

  r = run_nekton("tokenizer encode bytes --text hi --ids-only");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "104 105\n");
  r = run_nekton("tokenizer encode bytes --text 'a b'");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "97\ta\n32\t \n98\tb\n3 tokens for 3 bytes\n");

  fs::path in = dir() / "bytes_in.txt";
  write_file(in, "x\ny\n");
  r = run_nekton("tokenizer encode bytes --ids-only --input " + in.string());
  EXPECT_EQ(r.out, "120 10 121 10\n");
  r = run_nekton("tokenizer encode bytes --per-line --input=" + in.string());
  EXPECT_EQ(r.out, "120\n121\n");

  r = run_nekton("tokenizer decode bytes 104 105,33");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "hi!");
  fs::path ids = dir() / "bytes.ids";
  write_file(ids, "[104, 105]\n256 10\n");
  fs::path out = dir() / "decoded.txt";
  r = run_nekton("tokenizer decode bytes --input " + ids.string() + " --output " + out.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_file(out), "hi\n");
}

TEST(TokenizerCli, TrainSentencePieceThenUse) {
  const std::string& model = sp_model();
  ASSERT_TRUE(fs::exists(model));
  fs::path vocab = fs::path(model).replace_extension(".vocab");
  ASSERT_TRUE(fs::exists(vocab));
  EXPECT_EQ(read_file(vocab).rfind("<unk>\t0\n<s>\t0\n</s>\t0\n<0x00>\t0\n", 0), 0u);

  RunResult r = run_nekton("tokenizer info " + model);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s :
       {"kind:           sentencepiece (bpe)", "vocab size:     600", "eod id:         2 </s>",
        "bos id:         1", "special tokens: 3", "<unk>", "piece <0x00>"})
    EXPECT_TRUE(contains(r.out, s)) << s << "\n" << r.out;

  // Per-line ids are exactly spm_encode's; decode inverts encode.
  std::string text =
      "The quick brown fox\n  two  spaces\tand tab\nGr\xc3\xbc\xc3\x9f\n"
      "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 bad \xff byte\n\n12345 digits\n";
  fs::path in = dir() / "sp_in.txt";
  write_file(in, text);
  r = run_nekton("tokenizer encode " + model + " --per-line --input " + in.string(), false);
  ASSERT_EQ(r.code, 0);
  RunResult ref = test::run_command(
      "spm_encode --model " + model + " --output_format=id < " + in.string(), false);
  ASSERT_EQ(ref.code, 0);
  EXPECT_EQ(r.out, ref.out);

  fs::path ids = dir() / "sp.ids";
  r = run_nekton("tokenizer encode " + model + " --ids-only --input " + in.string() + " --output " +
                 ids.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "");
  r = run_nekton("tokenizer decode " + model + " --input " + ids.string(), false);
  ASSERT_EQ(r.code, 0);
  std::string want = text;
  want.replace(want.find('\xff'), 1, "\xef\xbf\xbd");  // one U+FFFD per invalid byte
  EXPECT_EQ(r.out, want);

  // The same model is also reachable through its prefix form.
  fs::path prefix = dir() / "named" / "llama";
  r = run_nekton("tokenizer train --input " + corpus().string() +
                 " --vocab-size 500 --threads 2 --out " + prefix.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(prefix.string() + ".model"));
  EXPECT_TRUE(fs::exists(prefix.string() + ".vocab"));
}

// Byte-level BPE: train, then the saved folder is a tokenizer spec that
// encodes, decodes back to the text, and compresses the training text.
TEST(TokenizerCli, TrainBpeThenUse) {
  fs::path out = dir() / "bpe";
  RunResult r = run_nekton("tokenizer train --type bpe --input " + corpus().string() +
                           " --vocab-size 1000 --threads 2 --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "1000 tokens")) << r.out;
  for (const char* f : {"vocab.tiktoken", "tokenizer.json", "encoder.json", "vocab.bpe"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  r = run_nekton("tokenizer info " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "kind:           bpe")) << r.out;
  EXPECT_TRUE(contains(r.out, "vocab size:     1000")) << r.out;
  EXPECT_TRUE(contains(r.out, "eod id:         999 <|endoftext|>")) << r.out;
  fs::path ids = dir() / "bpe.ids", back = dir() / "bpe.back";
  r = run_nekton("tokenizer encode " + out.string() + " --ids-only --input " + corpus().string() +
                 " --output " + ids.string());
  ASSERT_EQ(r.code, 0) << r.out;
  size_t n_ids = 0;
  std::istringstream in(read_file(ids));
  for (std::string w; in >> w;) ++n_ids;
  std::string text = read_file(corpus());
  // Measured 2.5 bytes per token on this dictionary markup; bytes give 1.
  EXPECT_LT(n_ids * 2, text.size()) << "1000 tokens should give > 2 bytes per token";
  r = run_nekton("tokenizer decode " + out.string() + " --input " + ids.string() + " --output " +
                 back.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_file(back), text);
}

TEST(TokenizerCli, BadInputsExitOneWithAMessage) {
  auto bad = [](const std::string& args, const std::string& msg) {
    RunResult r = run_nekton(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, msg)) << args << "\nwanted: " << msg << "\ngot: " << r.out;
  };
  bad("tokenizer frob", "unknown subcommand 'frob'");
  bad("tokenizer info", "no tokenizer given");
  bad("tokenizer info nosuch", "tokenizer 'nosuch'");
  bad("tokenizer info " + (dir() / "missing.model").string(), "missing.model");
  fs::path garbage = dir() / "garbage.model";
  write_file(garbage, "not a model");
  bad("tokenizer info " + garbage.string(), "garbage.model");
  bad("tokenizer encode bytes --frob", "unknown option '--frob'");
  bad("tokenizer encode bytes", "--text");
  bad("tokenizer encode bytes --text a --input b", "exactly one");
  bad("tokenizer encode bytes --input " + (dir() / "nofile.txt").string(), "nofile.txt");
  bad("tokenizer encode bytes --text", "--text needs a value");
  bad("tokenizer decode bytes 104 abc", "'abc' is not a token id");
  bad("tokenizer decode bytes 104 300", "token id 300 at position 1");
  bad("tokenizer decode bytes -5", "token id -5 at position 0");
  bad("tokenizer decode bytes", "no token ids");
  fs::path ids = dir() / "bad.ids";
  write_file(ids, "1 2\n3 x4\n");
  bad("tokenizer decode bytes --input " + ids.string(), "bad.ids' line 2: 'x4'");
  bad("tokenizer decode " + sp_model() + " 5 600", "token id 600 at position 1");
  bad("tokenizer info bytes --count many", "--count: 'many' is not an integer");

  // Failed runs leave no output behind.
  fs::path out = dir() / "out" / "never";
  bad("tokenizer train --type bpe --input " + corpus().string() + " --vocab-size 100 --out " +
          out.string(),
      "vocab_size 100 is below the 256 byte tokens");
  bad("tokenizer train --type bpe --input " + (dir() / "nope.txt").string() +
          " --vocab-size 300 --out " + out.string(),
      "nope.txt");
  bad("tokenizer train --type bpe --input " + corpus().string() +
          " --vocab-size 300 --pattern '(unclosed' --out " + out.string(),
      "(unclosed");
  EXPECT_FALSE(fs::exists(out));
  bad("tokenizer train --type wordpiece --input x --vocab-size 300 --out " + out.string(),
      "--type must be sentencepiece or bpe");
  bad("tokenizer train --input " + (dir() / "nope.txt").string() + " --vocab-size 300 --out " +
          out.string(),
      "nope.txt");
  bad("tokenizer train --input " + corpus().string() + " --vocab-size 10 --out " + out.string(),
      "sentencepiece training");
  bad("tokenizer train --input " + corpus().string() + " --vocab-size 300", "--out");
  bad("tokenizer train --input " + corpus().string() + " --vocab-size x --out " + out.string(),
      "--vocab-size: 'x' is not an integer");
  EXPECT_FALSE(fs::exists(out.string() + ".model"));
  EXPECT_FALSE(fs::exists(out.string() + ".vocab"));
  if (fs::exists(out.parent_path())) {
    EXPECT_TRUE(fs::is_empty(out.parent_path()));
  }
  fs::path enc_out = dir() / "no_dir" / "ids.txt";
  bad("tokenizer encode bytes --text hi --output " + enc_out.string(), "no_dir");
  EXPECT_FALSE(fs::exists(enc_out));
}

}  // namespace
