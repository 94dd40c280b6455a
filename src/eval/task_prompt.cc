#include "eval/task_prompt.h"

#include <unicode/utf8.h>

#include <cctype>

#include "core/error.h"

namespace nk {

using Json = nlohmann::ordered_json;

void DocRef::fail_field(const std::string& field, const std::string& why) const {
  fail("{}: {} document {}: {}: {}", task->file, *file, index, field, why);
}

TaskPrompter::TaskPrompter(const TaskConfig& c, PromptStyle style)
    : c_(c),
      style_(std::move(style)),
      text_(c.doc_to_text, c.file + ": doc_to_text", false),
      target_(c.doc_to_target, c.file + ": doc_to_target", false),
      choice_(c.doc_to_choice.value_or(""), c.file + ": doc_to_choice", false),
      description_(c.description, c.file + ": description", false),
      prefix_(c.gen_prefix.value_or(""), c.file + ": gen_prefix", false) {}

std::optional<std::string> TaskPrompter::prefix(const Json& doc, const DocRef& at) const {
  if (!c_.gen_prefix) return std::nullopt;
  const Json v = resolve(*c_.gen_prefix, prefix_, doc, at, "gen_prefix");
  if (!v.is_string()) at.fail_field("gen_prefix", fmt::format("{} is not text", v.dump()));
  return v.get<std::string>();
}

Json TaskPrompter::resolve(const std::string& spec, const jinja::Template& t, const Json& doc,
                           const DocRef& at, const char* field) const {
  if (doc.contains(spec)) return doc[spec];
  try {
    return t.render(doc, true);
  } catch (const Error& e) {
    at.fail_field(field, e.what());
  }
}

namespace {
bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char ch : s)
    if (!std::isdigit(static_cast<unsigned char>(ch))) return false;
  return true;
}
}  // namespace

Json TaskPrompter::text(const Json& doc, const DocRef& at) const {
  Json v = resolve(c_.doc_to_text, text_, doc, at, "doc_to_text");
  if (v.is_string() && c_.has_choices() && all_digits(v.get<std::string>()))
    return std::stoll(v.get<std::string>());
  return v;
}

Json TaskPrompter::target(const Json& doc, const DocRef& at) const {
  Json v = resolve(c_.doc_to_target, target_, doc, at, "doc_to_target");
  if (!v.is_string() || doc.contains(c_.doc_to_target)) return v;
  const std::string s = v.get<std::string>();
  if (all_digits(s) && c_.has_choices()) return std::stoll(s);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') {
    try {
      return parse_list_literal(s, "doc_to_target");
    } catch (const Error& e) {
      at.fail_field("doc_to_target", e.what());
    }
  }
  return v;
}

std::vector<std::string> TaskPrompter::choices(const Json& doc, const DocRef& at) const {
  Json v;
  if (c_.choice_list) {
    v = *c_.choice_list;
  } else {
    v = resolve(*c_.doc_to_choice, choice_, doc, at, "doc_to_choice");
    if (v.is_string() && !doc.contains(*c_.doc_to_choice)) {
      const std::string& spec = *c_.doc_to_choice;
      if (spec.find('{') == std::string::npos && spec.find('[') == std::string::npos)
        at.fail_field("doc_to_choice",
                      fmt::format("the document has no field '{}' (and it is no list)", spec));
      try {
        v = parse_list_literal(v.get<std::string>(), "doc_to_choice");
      } catch (const Error& e) {
        at.fail_field("doc_to_choice", e.what());
      }
    }
  }
  if (!v.is_array() || v.empty()) at.fail_field("doc_to_choice", "not a non-empty list of choices");
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      at.fail_field("doc_to_choice", fmt::format("choice {} is {}, not a string", i, v[i].dump()));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::string TaskPrompter::answer(const Json& doc, const Json& t, const DocRef& at) const {
  if (t.is_array()) {
    if (t.empty()) at.fail_field("doc_to_target", "an empty list of targets");
    return t[0].is_string() ? t[0].get<std::string>() : t[0].dump();
  }
  if (t.is_string()) return t.get<std::string>();
  if (t.is_number_integer() && c_.has_choices()) {
    const std::vector<std::string> ch = choices(doc, at);
    const int64_t i = t.get<int64_t>();
    if (i < 0 || i >= int64_t(ch.size()))
      at.fail_field("doc_to_target",
                    fmt::format("choice index {} is out of range (the document has {} choices)", i,
                                ch.size()));
    return ch[size_t(i)];
  }
  at.fail_field("doc_to_target",
                fmt::format("{} is not text (and the task has no choices to index)", t.dump()));
}

std::string TaskPrompter::text_of(const Json& d, const DocRef& r) const {
  const Json q = text(d, r);
  if (q.is_string()) return q.get<std::string>();
  if (q.is_number_integer()) return answer(d, q, r);  // the harness indexes the choices
  r.fail_field("doc_to_text", fmt::format("{} is not text", q.dump()));
}

std::pair<std::string, std::string> TaskPrompter::preamble(
    const Json& doc, const DocRef& at,
    const std::vector<std::pair<const Json*, DocRef>>& shots) const {
  std::string description;
  if (!c_.description.empty()) {
    try {
      description = description_.render(doc, true);
    } catch (const Error& e) {
      at.fail_field("description", e.what());
    }
  }
  const std::string& inst = style_.system_instruction;
  const std::string system = !inst.empty() && !description.empty()
                                 ? inst + c_.fewshot_delimiter + description
                             : !inst.empty() ? inst
                                             : description;
  // The harness opens every shot's answer with the scored document's
  // gen_prefix and a space (when it is not empty).
  const std::string gp = prefix(doc, at).value_or("");
  const std::string lead = gp.empty() ? "" : gp + " ";
  std::string shot_text;
  for (const auto& [d, r] : shots) {
    shot_text += text_of(*d, r);
    const Json t = target(*d, r);
    if (t.is_string() && t.get<std::string>().empty()) continue;
    shot_text += c_.target_delimiter + lead + answer(*d, t, r) + c_.fewshot_delimiter;
  }
  return {system, shot_text};
}

std::string TaskPrompter::labeled_examples(
    const Json& doc, const DocRef& at,
    const std::vector<std::pair<const Json*, DocRef>>& shots) const {
  if (style_.chat)
    at.fail_field("doc_to_text",
                  "a multiple-input task (doc_to_text an index into contexts) is not supported "
                  "with eval.apply_chat_template");
  const auto [system, shot_text] = preamble(doc, at, shots);
  return system + shot_text;
}

std::string TaskPrompter::context(const Json& doc, const DocRef& at,
                                  const std::vector<std::pair<const Json*, DocRef>>& shots) const {
  const auto [system, shot_text] = preamble(doc, at, shots);
  const Json q = text(doc, at);
  if (!q.is_string())
    at.fail_field("doc_to_text",
                  fmt::format("{} is not text (an index only where the first scored document's is, "
                              "making the task multiple-input)",
                              q.dump()));
  const std::optional<std::string> gp = prefix(doc, at);
  if (!style_.chat)
    return system + shot_text + q.get<std::string>() + (gp ? c_.target_delimiter + *gp : "");
  // With a gen_prefix (not empty) the assistant's turn is opened by it: the
  // conversation rendered without a generation prompt and cut after it
  // (continue_final_message), each multiturn shot's answer led by it too.
  const bool opened = gp && !gp->empty();
  const std::string lead = opened ? *gp + " " : "";
  std::vector<ChatMessage> msgs;
  if (!system.empty()) msgs.push_back({"system", system});
  if (!shots.empty() && style_.multiturn) {
    for (const auto& [d, r] : shots) {
      msgs.push_back({"user", text_of(*d, r)});
      msgs.push_back({"assistant", lead + answer(*d, target(*d, r), r)});
    }
  } else if (!shots.empty()) {
    msgs.push_back({"user", shot_text});
  }
  if (style_.multiturn || msgs.empty() || msgs.back().role == "system")
    msgs.push_back({"user", q.get<std::string>()});
  else
    msgs.back().content += q.get<std::string>();
  if (opened) msgs.push_back({"assistant", *gp});
  try {
    const std::string text = style_.chat->text(msgs, style_.specials, !opened);
    return opened ? continue_final_message(text, msgs) : text;
  } catch (const Error& e) {
    at.fail_field("chat template", e.what());
  }
}

FewshotSampler::FewshotSampler(const TaskConfig& c, const std::vector<Json>* pool, uint64_t seed)
    : c_(c), pool_(pool), rnd_(seed) {}

std::vector<int64_t> FewshotSampler::draw(const Json& doc, int64_t n) {
  if (n == 0) return {};
  const int64_t want = n + (c_.fewshot_excludes_doc() ? 1 : 0);
  const int64_t have = int64_t(pool_->size());
  if (want > have)
    fail("{}: num_fewshot {} needs {} documents in split '{}', which has {}", c_.file, n, want,
         c_.fewshot_docs_split(), have);
  std::vector<int64_t> drawn;
  if (c_.sampler == "first_n") {
    for (int64_t i = 0; i < want; ++i) drawn.push_back(i);
  } else {
    drawn = rnd_.sample(have, want);
  }
  std::vector<int64_t> out;
  for (int64_t i : drawn)
    if (int64_t(out.size()) < n && (*pool_)[size_t(i)] != doc) out.push_back(i);
  return out;
}

namespace {

struct LiteralParser {
  const std::string& s;
  const std::string& what;
  size_t p = 0;

  [[noreturn]] void bad(const std::string& why) const {
    fail("{}: '{}' is not a list literal: {} at offset {}", what, s, why, p);
  }
  void ws() {
    while (p < s.size() && std::isspace(static_cast<unsigned char>(s[p]))) ++p;
  }
  static void put_utf8(std::string& out, uint32_t cp) {
    char buf[4];
    int32_t n = 0;
    UBool err = false;
    U8_APPEND(buf, n, 4, cp, err);
    if (!err) out.append(buf, size_t(n));
  }
  std::string str() {
    const char q = s[p++];
    std::string out;
    while (true) {
      if (p >= s.size()) bad("an unterminated string");
      const char ch = s[p++];
      if (ch == q) return out;
      if (ch != '\\') {
        out += ch;
        continue;
      }
      if (p >= s.size()) bad("an unterminated escape");
      const char e = s[p++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case '0':
          out += '\0';
          break;
        case 'u':
        case 'x': {
          const size_t len = e == 'u' ? 4 : 2;
          if (p + len > s.size()) bad("a short escape");
          uint32_t cp = uint32_t(std::stoul(s.substr(p, len), nullptr, 16));
          p += len;
          // A JSON surrogate pair.
          if (e == 'u' && cp >= 0xD800 && cp < 0xDC00 && p + 6 <= s.size() && s[p] == '\\' &&
              s[p + 1] == 'u') {
            const uint32_t lo = uint32_t(std::stoul(s.substr(p + 2, 4), nullptr, 16));
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p += 6;
          }
          put_utf8(out, cp);
          break;
        }
        default:
          out += e;  // \\, \', \" and the rest as themselves
      }
    }
  }
  Json value() {
    ws();
    if (p >= s.size()) bad("the text ends");
    const char ch = s[p];
    if (ch == '[' || ch == '(') {
      const char close = ch == '[' ? ']' : ')';
      ++p;
      Json a = Json::array();
      ws();
      if (p < s.size() && s[p] == close) return ++p, a;
      while (true) {
        a.push_back(value());
        ws();
        if (p < s.size() && s[p] == ',') {
          ++p;
          ws();
          if (p < s.size() && s[p] == close) return ++p, a;
          continue;
        }
        if (p < s.size() && s[p] == close) return ++p, a;
        bad("expected ',' or the list's end");
      }
    }
    if (ch == '\'' || ch == '"') return str();
    for (const auto& [word, v] :
         std::initializer_list<std::pair<const char*, Json>>{{"True", true},
                                                             {"False", false},
                                                             {"None", nullptr},
                                                             {"true", true},
                                                             {"false", false},
                                                             {"null", nullptr}}) {
      const std::string w = word;
      if (s.compare(p, w.size(), w) == 0) return p += w.size(), v;
    }
    size_t used = 0;
    const std::string rest = s.substr(p);
    try {
      const double d = std::stod(rest, &used);
      const std::string num = rest.substr(0, used);
      p += used;
      if (num.find_first_of(".eE") == std::string::npos) return std::stoll(num);
      return d;
    } catch (const std::exception&) {
      bad("an unexpected character");
    }
  }
};

}  // namespace

Json parse_list_literal(const std::string& s, const std::string& what) {
  LiteralParser lp{s, what};
  Json v = lp.value();
  lp.ws();
  if (lp.p != s.size()) lp.bad("text after the list");
  if (!v.is_array()) lp.bad("not a list");
  return v;
}

}  // namespace nk
