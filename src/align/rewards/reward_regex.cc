#include "align/rewards/reward_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace nk {

namespace {
pcre2_code* code_of(void* p) {
  return static_cast<pcre2_code*>(p);
}
pcre2_match_data* md_of(void* p) {
  return static_cast<pcre2_match_data*>(p);
}
}  // namespace

RewardRegex::RewardRegex(const std::string& key, const std::string& pattern, bool dotall)
    : key_(key), pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  const uint32_t opts =
      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (dotall ? PCRE2_DOTALL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   opts, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("{}: the regular expression '{}' does not compile: {} at offset {}", key, pattern,
         reinterpret_cast<char*>(msg), off);
  }
  code_ = code;
  md_ = pcre2_match_data_create_from_pattern(code, nullptr);
  pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &groups_);
}

RewardRegex::~RewardRegex() {
  pcre2_match_data_free(md_of(md_));
  pcre2_code_free(code_of(code_));
}

bool RewardRegex::full_match(std::string_view text) const {
  const int rc = pcre2_match(code_of(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, md_of(md_), nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail("{}: matching '{}' failed (PCRE2 error {})", key_, pattern_, rc);
  return true;
}

std::optional<std::string> RewardRegex::first(std::string_view text) const {
  return find(text, false);
}

std::optional<std::string> RewardRegex::last(std::string_view text) const {
  return find(text, true);
}

std::optional<std::string> RewardRegex::find(std::string_view text, bool last) const {
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::optional<std::string> found;
  size_t at = 0;
  while (at <= text.size()) {
    const int rc = pcre2_match(code_of(code_), subj, text.size(), at, 0, md_of(md_), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("{}: matching '{}' failed (PCRE2 error {})", key_, pattern_, rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md_of(md_));
    // Group 1 when it took part, else the whole match.
    const bool group = groups_ > 0 && rc > 1 && ov[2] != PCRE2_UNSET;
    const size_t b = group ? ov[2] : ov[0], e = group ? ov[3] : ov[1];
    found = std::string(text.substr(b, e - b));
    if (!last) break;
    if (ov[1] > ov[0]) {
      at = ov[1];
    } else {  // an empty match: step over one character
      at = ov[1] + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
    }
  }
  return found;
}

}  // namespace nk
