#include "data/chat/sft_data.h"

#include <algorithm>

#include "core/error.h"
#include "core/json.h"
#include "data/jsonl_reader.h"

namespace nk {
namespace {

using json = nlohmann::json;

template <class Json>
const std::string& string_field(const Json& obj, const std::string& key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) fail("{}: no \"{}\"", where, key);
  if (!it->is_string()) fail("{}: \"{}\" must be a string, not {}", where, key, it->type_name());
  return it->template get_ref<const std::string&>();
}

// One message of a "messages" list: role and content, and the other keys
// (tool_calls, tool_call_id, name, ...) for a Jinja template; an assistant
// message with tool_calls may have a null content.
ChatMessage message_from(const nlohmann::ordered_json& m, const std::string& at) {
  if (!m.is_object()) fail("{}: a message must be an object with role and content", at);
  ChatMessage x;
  x.role = string_field(m, "role", at);
  if (x.role != "system" && x.role != "user" && x.role != "assistant" && x.role != "tool")
    fail("{}: role '{}' is none of system, user, assistant, tool", at, x.role);
  const auto content = m.find("content");
  const auto calls = m.find("tool_calls");
  const bool has_calls = calls != m.end() && !calls->is_null();
  if (has_calls && !calls->is_array())
    fail("{}: \"tool_calls\" must be a list, not {}", at, calls->type_name());
  if (content != m.end() && content->is_null() && has_calls && x.role == "assistant") {
    x.extra = nlohmann::ordered_json::object();
    x.extra["content"] = nullptr;
  } else {
    x.content = string_field(m, "content", at);
  }
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (it.key() == "role" || it.key() == "content") continue;
    if (x.extra.is_null()) x.extra = nlohmann::ordered_json::object();
    x.extra[it.key()] = it.value();
  }
  return x;
}

// Byte ranges [begin, end) of the trained segments in their concatenation.
std::vector<std::pair<size_t, size_t>> trained_ranges(const std::vector<ChatSegment>& segments) {
  std::vector<std::pair<size_t, size_t>> r;
  size_t at = 0;
  for (const ChatSegment& s : segments) {
    if (s.trained) r.emplace_back(at, at + s.text.size());
    at += s.text.size();
  }
  return r;
}

}  // namespace

std::vector<ChatMessage> conversation_from_record(const nlohmann::ordered_json& rec,
                                                  const SftOptions& opt, const std::string& where) {
  if (!rec.is_object()) fail("{}: a record must be a JSON object", where);
  std::vector<ChatMessage> c;
  if (rec.contains(opt.messages_key)) {
    const auto& m = rec[opt.messages_key];
    if (!m.is_array() || m.empty())
      fail("{}: \"{}\" must be a non-empty array of messages", where, opt.messages_key);
    for (size_t i = 0; i < m.size(); ++i)
      c.push_back(message_from(m[i], fmt::format("{}: {}[{}]", where, opt.messages_key, i)));
  } else if (rec.contains(opt.input_key) || rec.contains(opt.output_key)) {
    if (rec.contains(opt.system_key))
      c.push_back({"system", string_field(rec, opt.system_key, where)});
    c.push_back({"user", string_field(rec, opt.input_key, where)});
    c.push_back({"assistant", string_field(rec, opt.output_key, where)});
    if (c.back().content.empty()) fail("{}: \"{}\" is empty", where, opt.output_key);
  } else {
    fail("{}: neither \"{}\" nor \"{}\"/\"{}\" in the record", where, opt.messages_key,
         opt.input_key, opt.output_key);
  }
  if (std::none_of(c.begin(), c.end(), [](const ChatMessage& x) { return x.role == "assistant"; }))
    fail("{}: the conversation has no assistant message (nothing to learn)", where);
  return c;
}

SftSample tokenize_chat(const std::vector<ChatSegment>& segments, const Tokenizer& tok,
                        LossOn loss_on) {
  SftSample s;
  const std::string text = chat_text(segments);
  tok.encode_with_specials(text, s.tokens);
  s.trained.assign(s.tokens.size(), loss_on == LossOn::All ? 1 : 0);
  if (loss_on == LossOn::All) return s;
  const auto ranges = trained_ranges(segments);
  // Each token's byte range in `text`, from the bytes it stands for. A
  // SentencePiece model adds a dummy prefix (a leading space) to each piece of
  // text between special tokens: a token whose bytes are the text's with one
  // more space in front covers the text without it.
  size_t at = 0, r = 0;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const std::string b = tok.token_bytes(s.tokens[i]);
    size_t n = b.size();
    if (text.compare(at, n, b) != 0) {
      if (b.empty() || b[0] != ' ' || text.compare(at, n - 1, b, 1) != 0)
        fail(
            "chat sample: token {} ('{}') does not match the rendered text at byte {}; the "
            "tokenizer normalizes the text",
            i, b, at);
      --n;
    }
    const size_t e = at + n;
    while (r < ranges.size() && ranges[r].second <= at) ++r;
    s.trained[i] = r < ranges.size() && ranges[r].first < e && at < e;
    at = e;
  }
  return s;
}

std::vector<ChatSegment> render_record(std::string_view line, const std::string& where,
                                       const ChatTemplate& tmpl, const ChatSpecials& specials,
                                       const SftOptions& opt) {
  // In the record's own key order: a template's tojson writes tool calls and
  // schemas as given.
  nlohmann::ordered_json rec;
  try {
    rec = nlohmann::ordered_json::parse(line);
  } catch (const nlohmann::json::exception&) {
    parse_json(std::string(line), where);  // the error with its line and byte
    throw;
  }
  const std::vector<ChatMessage> conv = conversation_from_record(rec, opt, where);
  try {
    return tmpl.render(conv, specials, false);
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
}

SftData read_sft_jsonl(const std::string& path, const ChatTemplate& tmpl,
                       const ChatSpecials& specials, const Tokenizer& tok, const SftOptions& opt) {
  SftData d;
  JsonlReader reader(path);
  std::string_view line;
  int64_t line_no = 0;
  while (reader.read_line(line, line_no)) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = fmt::format("{}:{}", path, line_no);
    SftSample s = tokenize_chat(render_record(line, where, tmpl, specials, opt), tok, opt.loss_on);
    const bool truncated = opt.max_tokens > 0 && int64_t(s.tokens.size()) > opt.max_tokens;
    if (truncated) {
      if (opt.overlong == OverlongSample::Drop) {
        ++d.stats.dropped;
        continue;
      }
      s.tokens.resize(size_t(opt.max_tokens));
      s.trained.resize(size_t(opt.max_tokens));
    }
    // Token 0 is never predicted: a sample needs a trained token after it.
    if (std::none_of(s.trained.begin() + 1, s.trained.end(), [](uint8_t t) { return t != 0; })) {
      ++d.stats.dropped;
      continue;
    }
    d.stats.truncated += truncated;  // counted when kept
    ++d.stats.records;
    d.stats.tokens += int64_t(s.tokens.size());
    d.stats.trained_tokens += std::count(s.trained.begin() + 1, s.trained.end(), 1);
    d.tokens.push_back(std::move(s.tokens));
    d.trained.push_back(std::move(s.trained));
  }
  if (d.tokens.empty())
    fail("{}: no usable sample ({} dropped{})", path, d.stats.dropped,
         opt.max_tokens > 0 ? fmt::format(", limit {} tokens", opt.max_tokens) : "");
  return d;
}

PackedRows sft_rows(const SftData& data, int64_t seq_len, bool pack, int32_t pad_id) {
  PackingOptions o;
  o.seq_len = seq_len;
  o.algorithm = pack ? PackAlgorithm::FirstFitDecreasing : PackAlgorithm::OnePerRow;
  o.overlong = OverlongPolicy::Truncate;
  o.pad_id = pad_id;
  return pack_documents(data.tokens, o, data.trained);
}

SftDataset::SftDataset(PackedRows rows, uint64_t seed, bool shuffle, std::string name)
    : rows_(std::move(rows)), name_(std::move(name)), order_(rows_.n_rows, seed, shuffle) {
  if (rows_.n_rows == 0) fail("{}: no rows", name_);
}

void SftDataset::sample(int64_t, int32_t*) const {
  NK_CHECK(false, "{}: a dataset of rows has no windows; read it with row()", name_);
}

int64_t SftDataset::row_of(int64_t i) const {
  return order_.at(i);
}

std::string SftDataset::describe(int64_t i) const {
  return fmt::format("{}, row {} (sample {})", name_, row_of(i), i);
}

void SftDataset::row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                     int32_t* cu_seqlens) const {
  const int64_t r = row_of(i), T = rows_.seq_len, S1 = rows_.max_segments + 1;
  std::copy_n(rows_.tokens.data() + r * T, T, tokens);
  std::copy_n(rows_.targets.data() + r * T, T, targets);
  std::copy_n(rows_.position_ids.data() + r * T, T, positions);
  std::copy_n(rows_.cu_seqlens.data() + r * S1, S1, cu_seqlens);
}

}  // namespace nk
