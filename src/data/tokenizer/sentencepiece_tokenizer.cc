#include "data/tokenizer/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/error.h"

namespace nk {

namespace {

std::string read_model_file(const std::string& path) {
  if (std::filesystem::is_directory(path))
    fail("sentencepiece model '{}': is a directory, not a .model file", path);
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("sentencepiece model '{}': cannot open: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("sentencepiece model '{}': read error", path);
  return ss.str();
}

// Protocol-buffer wire format, just enough to read one varint field of one
// embedded message (the Debian package ships no sentencepiece_model.pb.h).
bool read_varint(std::string_view s, size_t& at, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && at < s.size(); shift += 7) {
    uint8_t b = static_cast<uint8_t>(s[at++]);
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// Finds field `field` of message `msg`: a varint (wire type 0) into `v`, or a
// length-delimited field (wire type 2) into `sub`. False if absent or malformed.
bool find_field(std::string_view msg, uint32_t field, uint64_t* v, std::string_view* sub) {
  size_t at = 0;
  bool found = false;
  while (at < msg.size()) {
    uint64_t key, x;
    if (!read_varint(msg, at, key)) return false;
    uint32_t num = uint32_t(key >> 3), type = uint32_t(key & 7);
    switch (type) {
      case 0:
        if (!read_varint(msg, at, x)) return false;
        if (num == field && v) *v = x, found = true;
        break;
      case 1:
        at += 8;
        break;
      case 5:
        at += 4;
        break;
      case 2:
        if (!read_varint(msg, at, x) || x > msg.size() - at) return false;
        if (num == field && sub) *sub = msg.substr(at, size_t(x)), found = true;
        at += size_t(x);
        break;
      default:
        return false;
    }
  }
  return found && at == msg.size();
}

// Sentences for the trainer: the lines of each file in turn, split exactly as
// spm_train's reader (std::getline) splits them; gzip read transparently.
class FileLines : public sentencepiece::SentenceIterator {
 public:
  explicit FileLines(const std::vector<std::string>& files) : files_(files) { advance(); }
  ~FileLines() override { close(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }

 private:
  void close() {
    if (f_) gzclose(f_);
    f_ = nullptr;
  }
  // Refills buf_ from the current file; false at the end of the file.
  bool fill() {
    buf_.resize(1 << 20);
    int n = gzread(f_, buf_.data(), unsigned(buf_.size()));
    if (n < 0) {
      int code;
      std::string msg = gzerror(f_, &code);
      error(fmt::format("training input '{}': read error: {}", files_[file_], msg));
      return false;
    }
    buf_.resize(size_t(n));
    pos_ = 0;
    return n > 0;
  }
  void error(const std::string& msg) {
    status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal, msg);
    done_ = true;
  }
  void advance() {
    line_.clear();
    while (!done_) {
      if (!f_) {
        if (file_ + 1 >= files_.size() && opened_) {
          done_ = true;
          return;
        }
        if (opened_) ++file_;
        opened_ = true;
        f_ = gzopen(files_[file_].c_str(), "rb");
        if (!f_)
          return error(fmt::format("training input '{}': cannot open: {}", files_[file_],
                                   std::strerror(errno)));
        gzbuffer(f_, 1 << 20);
        buf_.clear();
        pos_ = 0;
        partial_ = false;
      }
      if (pos_ == buf_.size() && !fill()) {
        if (done_) return;  // read error
        close();
        if (partial_) return;  // last line without '\n'
        continue;
      }
      const char* b = buf_.data() + pos_;
      const char* nl = static_cast<const char*>(std::memchr(b, '\n', buf_.size() - pos_));
      if (nl) {
        line_.append(b, nl);
        pos_ += size_t(nl - b) + 1;
        partial_ = false;
        return;
      }
      line_.append(b, buf_.size() - pos_);
      pos_ = buf_.size();
      partial_ = true;
    }
  }

  std::vector<std::string> files_;
  size_t file_ = 0;
  bool opened_ = false, done_ = false, partial_ = false;
  gzFile f_ = nullptr;
  std::string buf_, line_;
  size_t pos_ = 0;
  sentencepiece::util::Status status_;
};

}  // namespace

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::open(const std::string& path) {
  return from_bytes(read_model_file(path), path);
}

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_bytes(
    std::string_view model_bytes, const std::string& name) {
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer());
  t->path_ = name;
  t->sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  if (model_bytes.empty()) fail("sentencepiece model '{}': empty file", name);
  sentencepiece::util::Status st;
  try {
    st = t->sp_->LoadFromSerializedProto(model_bytes);
  } catch (const std::exception& e) {
    // Most bad models come back as a status, but the trie SentencePiece builds
    // while loading (Darts) throws on some, e.g. a zero-length piece.
    fail("sentencepiece model '{}': not a valid SentencePiece model: {}", name, e.what());
  }
  if (!st.ok())
    fail("sentencepiece model '{}': not a valid SentencePiece model: {}", name, st.message());
  if (t->sp_->GetPieceSize() <= 0) fail("sentencepiece model '{}': no pieces", name);
  for (int id = 0; id < t->sp_->GetPieceSize(); ++id)
    if (t->sp_->IsControl(id) || t->sp_->IsUnknown(id))
      t->specials_.emplace_back(t->sp_->IdToPiece(id), id);
  return t;
}

int64_t SentencePieceTokenizer::vocab_size() const {
  return sp_->GetPieceSize();
}

void SentencePieceTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  auto st = sp_->Encode(text, &ids);
  if (!st.ok()) fail("sentencepiece model '{}': encode failed: {}", path_, st.message());
  out.insert(out.end(), ids.begin(), ids.end());
}

void SentencePieceTokenizer::encode_with_specials(std::string_view text,
                                                  std::vector<int32_t>& out) const {
  // next[k]: where specials_[k] next occurs at or after `at` (npos: never).
  std::vector<size_t> next(specials_.size());
  for (size_t k = 0; k < specials_.size(); ++k) next[k] = text.find(specials_[k].first);
  size_t at = 0;
  while (at < text.size()) {
    // The earliest special at or after `at`; the longest one on a tie.
    size_t best = std::string_view::npos, best_len = 0;
    int32_t best_id = -1;
    for (size_t k = 0; k < specials_.size(); ++k) {
      const std::string& s = specials_[k].first;
      if (s.empty()) continue;
      if (next[k] != std::string_view::npos && next[k] < at) next[k] = text.find(s, at);
      size_t p = next[k];
      if (p < best || (p == best && p != std::string_view::npos && s.size() > best_len))
        best = p, best_len = s.size(), best_id = specials_[k].second;
    }
    if (best == std::string_view::npos) break;
    if (best > at) encode(text.substr(at, best - at), out);
    out.push_back(best_id);
    at = best + best_len;
  }
  if (at < text.size()) encode(text.substr(at), out);
}

void SentencePieceTokenizer::check_id(int32_t id, int64_t position) const {
  if (id < 0 || id >= sp_->GetPieceSize()) {
    if (position >= 0)
      fail("token id {} at position {} is outside the vocabulary [0, {}) of '{}'", id, position,
           sp_->GetPieceSize(), path_);
    fail("token id {} is outside the vocabulary [0, {}) of '{}'", id, sp_->GetPieceSize(), path_);
  }
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<int> v(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    check_id(ids[i], int64_t(i));
    v[i] = ids[i];
  }
  std::string out;
  auto st = sp_->Decode(v, &out);
  if (!st.ok()) fail("sentencepiece model '{}': decode failed: {}", path_, st.message());
  return out;
}

std::string SentencePieceTokenizer::piece(int32_t id) const {
  check_id(id, -1);
  return sp_->IdToPiece(id);
}

std::string SentencePieceTokenizer::token_bytes(int32_t id) const {
  std::string p = piece(id);
  if (sp_->IsByte(id)) {
    // "<0xAB>"
    if (p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>')
      return std::string(1, char(std::stoi(p.substr(3, 2), nullptr, 16)));
    fail("sentencepiece model '{}': byte piece {} has malformed text '{}'", path_, id, p);
  }
  if (sp_->IsControl(id) || sp_->IsUnknown(id)) return p;
  static const std::string kSpace = "\xe2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK
  std::string out;
  out.reserve(p.size());
  for (size_t i = 0; i < p.size();) {
    if (p.compare(i, kSpace.size(), kSpace) == 0) {
      out.push_back(' ');
      i += kSpace.size();
    } else {
      out.push_back(p[i++]);
    }
  }
  return out;
}

int32_t SentencePieceTokenizer::eod_id() const {
  return sp_->eos_id();
}
int32_t SentencePieceTokenizer::bos_id() const {
  return sp_->bos_id();
}
int32_t SentencePieceTokenizer::unk_id() const {
  return sp_->unk_id();
}
int32_t SentencePieceTokenizer::pad_id() const {
  return sp_->pad_id();
}

float SentencePieceTokenizer::score(int32_t id) const {
  check_id(id, -1);
  return sp_->GetScore(id);
}

SentencePieceTokenizer::PieceType SentencePieceTokenizer::piece_type(int32_t id) const {
  check_id(id, -1);
  if (sp_->IsUnknown(id)) return PieceType::kUnknown;
  if (sp_->IsControl(id)) return PieceType::kControl;
  if (sp_->IsUnused(id)) return PieceType::kUnused;
  if (sp_->IsByte(id)) return PieceType::kByte;
  return PieceType::kNormal;
}

std::string SentencePieceTokenizer::model_type() const {
  // ModelProto.trainer_spec (field 2) . model_type (field 3), default UNIGRAM.
  std::string bytes = sp_->serialized_model_proto();
  std::string_view spec;
  uint64_t type = 1;
  if (find_field(bytes, 2, nullptr, &spec)) find_field(spec, 3, &type, nullptr);
  switch (type) {
    case 1:
      return "unigram";
    case 2:
      return "bpe";
    case 3:
      return "word";
    case 4:
      return "char";
    default:
      return fmt::format("unknown ({})", type);
  }
}

bool SentencePieceTokenizer::add_dummy_prefix() const {
  // ModelProto.normalizer_spec (field 3) . add_dummy_prefix (field 3), default true.
  std::string bytes = sp_->serialized_model_proto();
  std::string_view spec;
  uint64_t v = 1;
  if (find_field(bytes, 3, nullptr, &spec)) find_field(spec, 3, &v, nullptr);
  return v != 0;
}

std::string SentencePieceTokenizer::vocab_text() const {
  std::string out;
  for (int id = 0; id < sp_->GetPieceSize(); ++id)
    out += fmt::format("{}\t{:g}\n", sp_->IdToPiece(id), sp_->GetScore(id));
  return out;
}

std::string train_sentencepiece(const SentencePieceTrainOptions& o) {
  if (o.inputs.empty()) fail("sentencepiece training: no input files");
  for (auto& path : o.inputs) {
    if (std::filesystem::is_directory(path)) fail("training input '{}': is a directory", path);
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("training input '{}': cannot open: {}", path, std::strerror(errno));
  }
  if (o.vocab_size <= 0)
    fail("sentencepiece training: vocab size must be > 0, got {}", o.vocab_size);
  if (!(o.character_coverage > 0 && o.character_coverage <= 1))
    fail("sentencepiece training: character coverage must be in (0, 1], got {}",
         o.character_coverage);
  int threads = o.num_threads > 0 ? o.num_threads : int(std::thread::hardware_concurrency());
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  std::string symbols;
  for (auto& s : o.user_defined_symbols) {
    if (s.find(',') != std::string::npos)
      fail("sentencepiece training: user-defined symbol '{}' contains a comma", s);
    symbols += (symbols.empty() ? "" : ",") + s;
  }
  std::unordered_map<std::string, std::string> kw = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"character_coverage", fmt::format("{}", o.character_coverage)},
      {"byte_fallback", b(o.byte_fallback)},
      {"split_digits", b(o.split_digits)},
      {"add_dummy_prefix", b(o.add_dummy_prefix)},
      {"remove_extra_whitespaces", b(o.remove_extra_whitespaces)},
      {"normalization_rule_name", o.normalization_rule_name},
      {"allow_whitespace_only_pieces", "true"},
      {"input_sentence_size", std::to_string(o.input_sentence_size)},
      {"max_sentence_length", std::to_string(o.max_sentence_length)},
      {"num_threads", std::to_string(std::max(threads, 1))},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"minloglevel", o.verbose ? "0" : "1"},
  };
  if (!symbols.empty()) kw["user_defined_symbols"] = symbols;
  sentencepiece::SetRandomGeneratorSeed(1);  // sentence sampling is reproducible
  FileLines lines(o.inputs);
  std::string model;
  auto st = sentencepiece::SentencePieceTrainer::Train(kw, &lines, &model);
  if (!st.ok()) fail("sentencepiece training: {}", st.message());
  if (model.empty()) fail("sentencepiece training: produced no model");
  return model;
}

}  // namespace nk
