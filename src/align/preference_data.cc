#include "align/preference_data.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "data/chat/sft_data.h"
#include "data/jsonl_reader.h"

namespace nk {
namespace {

using json = nlohmann::json;

// A prompt or a completion as tokens, each marked when the loss predicts it.
struct Part {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;
};

struct Inputs {
  const Tokenizer& tok;
  const ChatTemplate& tmpl;
  const ChatSpecials& specials;
};

const json& field(const json& rec, const std::string& key, const std::string& where) {
  const auto it = rec.find(key);
  if (it == rec.end()) fail("{}: no \"{}\"", where, key);
  return *it;
}

std::vector<ChatMessage> messages_of(const json& v, const std::string& at) {
  if (!v.is_array() || v.empty()) fail("{}: must be a non-empty list of messages", at);
  std::vector<ChatMessage> m;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string here = fmt::format("{}[{}]", at, i);
    if (!v[i].is_object()) fail("{}: a message must be an object with role and content", here);
    for (const char* k : {"role", "content"})
      if (!v[i].contains(k) || !v[i][k].is_string()) fail("{}: \"{}\" must be a string", here, k);
    ChatMessage x{v[i]["role"].get<std::string>(), v[i]["content"].get<std::string>()};
    if (x.role != "system" && x.role != "user" && x.role != "assistant")
      fail("{}: role '{}' is none of system, user, assistant", here, x.role);
    m.push_back(std::move(x));
  }
  return m;
}

Part text_prompt(const std::string& s, const Inputs& in, const std::string& at) {
  if (s.empty()) fail("{}: the prompt is empty", at);
  Part p;
  in.tok.encode_with_specials(s, p.tokens);
  p.trained.assign(p.tokens.size(), 0);
  return p;
}

// A standard completion: its tokens and the end-of-document token, all trained.
Part text_completion(const std::string& s, const Inputs& in, const std::string& at) {
  if (s.empty()) fail("{}: the completion is empty", at);
  Part c;
  in.tok.encode_with_specials(s, c.tokens);
  if (in.tok.eod_id() >= 0) c.tokens.push_back(in.tok.eod_id());
  c.trained.assign(c.tokens.size(), 1);
  return c;
}

void check_chat_roles(const std::vector<ChatMessage>& prompt,
                      const std::vector<ChatMessage>& completion, const std::string& prompt_at,
                      const std::string& completion_at) {
  if (prompt.back().role != "user")
    fail("{}[{}]: the prompt ends with a '{}' message; it must end with the user's turn", prompt_at,
         prompt.size() - 1, prompt.back().role);
  for (size_t i = 0; i < completion.size(); ++i) {
    if (completion[i].role != "assistant")
      fail("{}[{}]: role '{}' in a completion, which holds assistant messages only", completion_at,
           i, completion[i].role);
    if (completion[i].content.empty()) fail("{}[{}]: the completion is empty", completion_at, i);
  }
}

// The prompt rendered with the generation prompt, and the completion as the
// rest of the whole conversation's rendering.
std::pair<Part, Part> chat_parts(const std::vector<ChatMessage>& prompt,
                                 const std::vector<ChatMessage>& completion, const Inputs& in,
                                 const std::string& where) {
  std::vector<ChatMessage> whole = prompt;
  whole.insert(whole.end(), completion.begin(), completion.end());
  std::string prefix;
  std::vector<ChatSegment> segs;
  try {
    prefix = chat_text(in.tmpl.render(prompt, in.specials, true));
    segs = in.tmpl.render(whole, in.specials, false);
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  const std::string text = chat_text(segs);
  if (text.compare(0, prefix.size(), prefix) != 0)
    fail(
        "{}: chat template {} does not render the prompt (with its generation prompt) as the "
        "beginning of the whole conversation",
        where, in.tmpl.name());
  // The segments after the prompt's bytes.
  std::vector<ChatSegment> rest;
  size_t at = 0;
  for (const ChatSegment& s : segs) {
    const size_t end = at + s.text.size();
    if (end > prefix.size())
      rest.push_back({s.text.substr(std::max(at, prefix.size()) - at), s.trained});
    at = end;
  }
  Part p, c;
  in.tok.encode_with_specials(prefix, p.tokens);
  p.trained.assign(p.tokens.size(), 0);
  SftSample s = tokenize_chat(rest, in.tok, LossOn::Assistant);
  c.tokens = std::move(s.tokens);
  c.trained = std::move(s.trained);
  return {std::move(p), std::move(c)};
}

// TRL's keep_end truncation of one example (its prompt and completions).
bool fit(Part& prompt, std::vector<Part*> completions, const PreferenceDataOptions& opt,
         const std::string& where) {
  const int64_t L = opt.max_length;
  int64_t longest = 0;
  for (const Part* c : completions) longest = std::max(longest, int64_t(c->tokens.size()));
  const int64_t P = int64_t(prompt.tokens.size());
  if (P + longest <= L) return false;
  if (opt.max_prompt_length > 0 && P > opt.max_prompt_length) {
    const int64_t cut = P - opt.max_prompt_length;
    prompt.tokens.erase(prompt.tokens.begin(), prompt.tokens.begin() + cut);
    prompt.trained.erase(prompt.trained.begin(), prompt.trained.begin() + cut);
  }
  const int64_t room = L - int64_t(prompt.tokens.size());
  if (room < 1)
    fail(
        "{}: the prompt's {} tokens leave no room for a completion in train.seq_len = {} "
        "(align.max_prompt_length keeps the end of long prompts)",
        where, prompt.tokens.size(), L);
  for (Part* c : completions)
    if (int64_t(c->tokens.size()) > room) {
      c->tokens.resize(size_t(room));
      c->trained.resize(size_t(room));
    }
  return true;
}

void add_sequence(PreferenceData& d, const Part& p, const Part& c, const std::string& where,
                  const char* what) {
  std::vector<int32_t> t = p.tokens;
  std::vector<uint8_t> m = p.trained;
  t.insert(t.end(), c.tokens.begin(), c.tokens.end());
  m.insert(m.end(), c.trained.begin(), c.trained.end());
  // Token 0 is never predicted: a sequence needs a completion token after it.
  if (t.size() < 2 || std::none_of(m.begin() + 1, m.end(), [](uint8_t x) { return x != 0; }))
    fail("{}: the {} completion has no token the loss can cover", where, what);
  d.tokens.push_back(std::move(t));
  d.trained.push_back(std::move(m));
}

struct Example {
  Part prompt;
  std::vector<Part> completions;  // chosen, rejected; or KTO's one
  bool desirable = true;
  std::optional<double> margin;  // paired: the record's margin, if it has one
};

std::optional<double> margin_of(const json& rec, const PreferenceDataOptions& opt,
                                const std::string& where) {
  const auto it = rec.find(opt.margin_key);
  if (it == rec.end()) return std::nullopt;
  if (!it->is_number() || !std::isfinite(it->get<double>()))
    fail("{}: {}: must be a finite number, not {}", where, opt.margin_key, it->dump());
  return it->get<double>();
}

Example paired_example(const json& rec, const Inputs& in, const PreferenceDataOptions& opt,
                       const std::string& where) {
  const json& chosen = field(rec, opt.chosen_key, where);
  const json& rejected = field(rec, opt.rejected_key, where);
  const std::string ck = fmt::format("{}: {}", where, opt.chosen_key),
                    rk = fmt::format("{}: {}", where, opt.rejected_key);
  std::string pk = fmt::format("{}: {}", where, opt.prompt_key);
  Example e;
  if (chosen.is_string()) {
    if (!rejected.is_string())
      fail("{}: must be a string like \"{}\", not {}", rk, opt.chosen_key, rejected.type_name());
    const json& prompt = field(rec, opt.prompt_key, where);
    if (!prompt.is_string()) fail("{}: must be a string, not {}", pk, prompt.type_name());
    e.prompt = text_prompt(prompt.get<std::string>(), in, pk);
    e.completions.push_back(text_completion(chosen.get<std::string>(), in, ck));
    e.completions.push_back(text_completion(rejected.get<std::string>(), in, rk));
    return e;
  }
  if (!chosen.is_array()) fail("{}: must be a string or a list of messages", ck);
  std::vector<ChatMessage> c = messages_of(chosen, ck), r = messages_of(rejected, rk), p;
  if (rec.contains(opt.prompt_key)) {
    p = messages_of(rec[opt.prompt_key], pk);
  } else {  // the implicit prompt: the messages both conversations begin with
    size_t k = 0;
    while (k < c.size() && k < r.size() && c[k].role == r[k].role && c[k].content == r[k].content)
      ++k;
    if (k == 0)
      fail("{}: no \"{}\", and {} and {} share no leading message to be the prompt", where,
           opt.prompt_key, opt.chosen_key, opt.rejected_key);
    if (k == c.size() || k == r.size())
      fail("{}: {} adds no message after the prompt the two conversations share", where,
           k == c.size() ? opt.chosen_key : opt.rejected_key);
    p.assign(c.begin(), c.begin() + int64_t(k));
    c.erase(c.begin(), c.begin() + int64_t(k));
    r.erase(r.begin(), r.begin() + int64_t(k));
    pk = fmt::format("{}: the prompt shared by {} and {}", where, opt.chosen_key, opt.rejected_key);
  }
  check_chat_roles(p, c, pk, ck);
  check_chat_roles(p, r, pk, rk);
  auto [pc, cc] = chat_parts(p, c, in, where);
  e.prompt = std::move(pc);
  e.completions.push_back(std::move(cc));
  e.completions.push_back(chat_parts(p, r, in, where).second);
  return e;
}

Example unpaired_example(const json& rec, const Inputs& in, const PreferenceDataOptions& opt,
                         const std::string& where) {
  const json& prompt = field(rec, opt.prompt_key, where);
  const json& completion = field(rec, opt.completion_key, where);
  const json& label = field(rec, opt.label_key, where);
  const std::string pk = fmt::format("{}: {}", where, opt.prompt_key),
                    ck = fmt::format("{}: {}", where, opt.completion_key);
  if (!label.is_boolean())
    fail("{}: {}: must be true or false, not {}", where, opt.label_key, label.dump());
  Example e;
  e.desirable = label.get<bool>();
  if (completion.is_string()) {
    if (!prompt.is_string()) fail("{}: must be a string, not {}", pk, prompt.type_name());
    e.prompt = text_prompt(prompt.get<std::string>(), in, pk);
    e.completions.push_back(text_completion(completion.get<std::string>(), in, ck));
    return e;
  }
  const std::vector<ChatMessage> p = messages_of(prompt, pk), c = messages_of(completion, ck);
  check_chat_roles(p, c, pk, ck);
  auto [pc, cc] = chat_parts(p, c, in, where);
  e.prompt = std::move(pc);
  e.completions.push_back(std::move(cc));
  return e;
}

}  // namespace

std::string PreferenceData::summary() const {
  return fmt::format("{}: {} {}, {} of {} truncated", path, examples(),
                     desirable.empty() ? "pairs" : "examples", truncated, examples());
}

PreferenceData read_preference_jsonl(const std::string& path, const Tokenizer& tok,
                                     const ChatTemplate& tmpl, const ChatSpecials& specials,
                                     const PreferenceDataOptions& opt) {
  NK_CHECK(opt.max_length >= 2, "read_preference_jsonl: max_length {}", opt.max_length);
  const Inputs in{tok, tmpl, specials};
  std::vector<Example> examples;
  std::vector<int64_t> lines;
  JsonlReader reader(path);
  std::string_view line;
  int64_t line_no = 0;
  while (reader.read_line(line, line_no)) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = fmt::format("{}:{}", path, line_no);
    const json rec = parse_json(std::string(line), where);
    if (!rec.is_object()) fail("{}: a record must be a JSON object", where);
    examples.push_back(opt.unpaired ? unpaired_example(rec, in, opt, where)
                                    : paired_example(rec, in, opt, where));
    if (opt.margins) examples.back().margin = margin_of(rec, opt, where);
    lines.push_back(line_no);
  }
  if (examples.empty()) fail("{}: no preference record", path);
  PreferenceData d;
  d.path = path;
  d.line = lines;
  const size_t n = examples.size();
  const size_t group = size_t(std::max<int64_t>(1, opt.kto_group));
  for (size_t i = 0; i < n; ++i) {
    const std::string where = fmt::format("{}:{}", path, lines[i]);
    Example& e = examples[i];
    if (opt.unpaired) {
      // The KL sequence: this prompt, the previous completion of its group.
      const size_t first = i / group * group, last = std::min(n, first + group) - 1;
      Part kl = examples[i == first ? last : i - 1].completions[0];
      d.truncated += fit(e.prompt, {&e.completions[0], &kl}, opt, where);
      add_sequence(d, e.prompt, e.completions[0], where, "example's");
      add_sequence(d, e.prompt, kl, where, "mismatched (KL)");
      d.desirable.push_back(e.desirable);
    } else {
      d.truncated += fit(e.prompt, {&e.completions[0], &e.completions[1]}, opt, where);
      add_sequence(d, e.prompt, e.completions[0], where, opt.chosen_key.c_str());
      add_sequence(d, e.prompt, e.completions[1], where, opt.rejected_key.c_str());
      if (e.margin.has_value() != examples[0].margin.has_value())
        fail("{}: {} \"{}\" where {}:{} has {}: margins go in every record or in none", where,
             e.margin ? "a" : "no", opt.margin_key, path, lines[0],
             examples[0].margin ? "one" : "none");
      if (e.margin) d.margin.push_back(*e.margin);
      if (d.tokens[2 * i] == d.tokens[2 * i + 1])
        fail("{}: {} and {} are the same {} tokens{}: nothing to prefer", where, opt.chosen_key,
             opt.rejected_key, d.tokens[2 * i].size(),
             d.tokens[2 * i].size() >= size_t(opt.max_length) ? " once truncated" : "");
    }
  }
  // The KL rows' prompts were cut with their examples; a KL completion
  // longer than the room left was cut in fit too.
  return d;
}

bool is_chat_prompt(const json& prompt, const std::string& where) {
  if (prompt.is_string()) return false;
  if (prompt.is_array()) return true;
  fail("{}: must be a string or a list of messages, not {}", where, prompt.type_name());
}

std::vector<int32_t> render_prompt(const json& prompt, const PreferenceRenderer& r,
                                   const std::string& where) {
  const Inputs in{r.tok, r.tmpl, r.specials};
  if (!is_chat_prompt(prompt, where))
    return text_prompt(prompt.get<std::string>(), in, where).tokens;
  const std::vector<ChatMessage> p = messages_of(prompt, where);
  if (p.back().role != "user")
    fail("{}[{}]: the prompt ends with a '{}' message; it must end with the user's turn", where,
         p.size() - 1, p.back().role);
  std::string text;
  try {
    text = chat_text(r.tmpl.render(p, r.specials, true));
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  std::vector<int32_t> tokens;
  r.tok.encode_with_specials(text, tokens);
  return tokens;
}

std::vector<int32_t> render_sequence(const json& prompt, const json& completion,
                                     const PreferenceRenderer& r, const std::string& where,
                                     int64_t* prompt_tokens) {
  const Inputs in{r.tok, r.tmpl, r.specials};
  const std::string pk = where, ck = where + " (completion)";
  Part p, c;
  if (!is_chat_prompt(prompt, pk)) {
    if (!completion.is_string())
      fail("{}: a string prompt takes a string completion, not {}", ck, completion.type_name());
    p = text_prompt(prompt.get<std::string>(), in, pk);
    c = text_completion(completion.get<std::string>(), in, ck);
  } else {
    const std::vector<ChatMessage> pm = messages_of(prompt, pk);
    std::vector<ChatMessage> cm;
    if (completion.is_string()) {
      if (completion.get_ref<const std::string&>().empty()) fail("{}: the completion is empty", ck);
      cm.push_back({"assistant", completion.get<std::string>()});
    } else {
      cm = messages_of(completion, ck);
    }
    check_chat_roles(pm, cm, pk, ck);
    std::tie(p, c) = chat_parts(pm, cm, in, where);
  }
  if (prompt_tokens) *prompt_tokens = int64_t(p.tokens.size());
  std::vector<int32_t> t = std::move(p.tokens);
  t.insert(t.end(), c.tokens.begin(), c.tokens.end());
  return t;
}

PreferenceDataset::PreferenceDataset(std::shared_ptr<const PreferenceData> data, int64_t seq_len,
                                     int32_t pad_id, uint64_t seed, bool shuffle, std::string name)
    : data_(std::move(data)),
      seq_len_(seq_len),
      pad_(pad_id),
      name_(std::move(name)),
      order_(data_->examples(), seed, shuffle) {
  NK_CHECK(data_->examples() > 0, "{}: no examples", name_);
  for (const auto& t : data_->tokens)
    NK_CHECK(int64_t(t.size()) <= seq_len_, "{}: a sequence of {} tokens in rows of {}", name_,
             t.size(), seq_len_);
}

void PreferenceDataset::sample(int64_t, int32_t*) const {
  NK_CHECK(false, "{}: a dataset of rows has no windows; read it with row()", name_);
}

int64_t PreferenceDataset::example_of(int64_t i) const {
  return order_.at(i / 2);  // rows 2k, 2k + 1: the k-th example read
}

int64_t PreferenceDataset::sequence_of(int64_t i) const {
  return 2 * example_of(i) + i % 2;
}

std::string PreferenceDataset::describe(int64_t i) const {
  const int64_t e = example_of(i);
  return fmt::format("{}, line {} (sample {})", name_, data_->line[size_t(e)], i);
}

void PreferenceDataset::sequence_row(int64_t s, int32_t* tokens, int32_t* targets) const {
  const std::vector<int32_t>& t = data_->tokens[size_t(s)];
  const std::vector<uint8_t>& m = data_->trained[size_t(s)];
  const int64_t n = int64_t(t.size());
  for (int64_t k = 0; k < seq_len_; ++k) {
    tokens[k] = k < n ? t[size_t(k)] : pad_;
    targets[k] = k + 1 < n && m[size_t(k + 1)] ? t[size_t(k + 1)] : -100;
  }
}

void PreferenceDataset::row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                            int32_t* cu_seqlens) const {
  sequence_row(sequence_of(i), tokens, targets);
  for (int64_t k = 0; k < seq_len_; ++k) positions[k] = int32_t(k);
  cu_seqlens[0] = 0;
  cu_seqlens[1] = int32_t(seq_len_);
}

}  // namespace nk
