#include "data/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "data/utf8.h"

namespace nk {

namespace {

// Unicode White_Space (PropList.txt), which Rust's regex crate uses for \s.
constexpr std::string_view kWhiteSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// Per-thread PCRE2 state: match data (one ovector pair is enough, pieces are
// whole matches) and a JIT stack large enough for long whitespace runs.
struct ThreadMatchState {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* js = pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(mc, nullptr, js); }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState s;
  return s;
}

}  // namespace

std::string pcre2_pattern_for(std::string_view pat) {
  std::string out;
  out.reserve(pat.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pat.size(); ++i) {
    char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      char e = pat[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpace;
        } else {
          out += '[';
          out += kWhiteSpace;
          out += ']';
        }
      } else if (e == 'S') {
        if (in_class) fail("pattern '{}': \\S inside a character class is not supported", pat);
        out += "[^";
        out += kWhiteSpace;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < pat.size() && pat[i + 1] == '^') out += pat[++i];
      if (i + 1 < pat.size() && pat[i + 1] == ']') out += pat[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::string pattern) : pattern_(std::move(pattern)) {
  std::string pcre = pcre2_pattern_for(pattern_);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre.data()), pcre.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("pre-tokenizer pattern '{}': {} at offset {}", pattern_, reinterpret_cast<char*>(msg),
         size_t(off));
  }
  re_ = std::make_unique<Compiled>();
  re_->code = code;
  re_->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

bool PreTokenizer::can_match_empty() const {
  uint32_t min_length = 0;
  return pcre2_pattern_info(re_->code, PCRE2_INFO_MINLENGTH, &min_length) != 0 || min_length == 0;
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::for_each_piece(std::string_view text, PieceFn fn) const {
  int64_t bad = find_invalid_utf8(text);
  if (bad >= 0) fail("pre-tokenizer: invalid UTF-8 at byte {}", bad);
  for_each_piece_valid(text, fn);
}

void PreTokenizer::for_each_piece_valid(std::string_view text, PieceFn fn) const {
  ThreadMatchState& st = thread_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t n = text.size(), pos = 0;
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
  while (pos < n) {
    int rc = re_->jit ? pcre2_jit_match(re_->code, subject, n, pos, 0, st.md, st.mc)
                      : pcre2_match(re_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, st.md, st.mc);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("pre-tokenizer pattern '{}': matching failed at byte {}: {}", pattern_, pos,
           reinterpret_cast<char*>(msg));
    }
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      fn(text.substr(b, e - b));
      pos = e;
    } else {
      // An empty match: step over one character and search again.
      pos = b + 1;
      while (pos < n && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> out;
  for_each_piece(text, [&](std::string_view p) { out.push_back(p); });
  return out;
}

}  // namespace nk
