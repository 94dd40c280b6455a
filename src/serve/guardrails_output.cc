#include "serve/guardrails_output.h"

#include <algorithm>

#include "curate/filters/pii.h"

namespace nk {

namespace {

// The byte offset `n` characters before `pos` (0 at the most).
size_t back_chars(std::string_view t, size_t pos, size_t n) {
  while (n > 0 && pos > 0) {
    --pos;
    while (pos > 0 && (static_cast<unsigned char>(t[pos]) & 0xC0) == 0x80) --pos;
    --n;
  }
  return pos;
}

}  // namespace

OutputRails::OutputRails(const GuardrailsConfig& c)
    : pii_placeholder_(c.output.pii_placeholder),
      refuse_(c.output.blocked_action == "refuse"),
      mask_(c.output.mask),
      window_(size_t(c.output.window)) {
  for (const std::string& name : c.output.pii) {
    curate::PiiType t;
    if (name == "all")
      pii_mask_ = curate::kAllPii;
    else if (curate::pii_type_of(name, t))
      pii_mask_ |= 1u << unsigned(t);
  }
  words_ = compile_rail_patterns(c, "output.blocked_words", c.output.blocked_words, true);
  regex_ = compile_rail_patterns(c, "output.blocked_regex", c.output.blocked_regex, false);
}

bool OutputRails::on(int rail) const {
  return rail == kPii ? pii_mask_ != 0 : rail == kWords ? !words_.empty() : !regex_.empty();
}

const char* OutputRails::name(int rail) {
  return rail == kPii     ? "output.pii"
         : rail == kWords ? "output.blocked_words"
                          : "output.blocked_regex";
}

int OutputRails::scan(std::string_view text, size_t from, std::vector<Match>& out) const {
  if (pii_mask_) {
    // The scanner judges a match by the text before it (a number opening a
    // line is a section, not an address): it starts kPiiContext characters
    // earlier, and what ends before `from` is left to the earlier scans.
    constexpr size_t kPiiContext = 32;
    const size_t at = back_chars(text, from, kPiiContext);
    for (const curate::PiiMatch& m : curate::find_pii(text.substr(at), pii_mask_))
      if (at + m.end > from)
        out.push_back({at + m.begin, at + m.end, kPii, false,
                       pii_placeholder_.empty() ? curate::pii_placeholder(m.type)
                                                : std::string_view(pii_placeholder_)});
  }
  std::vector<TextSpan> spans;
  for (int rail : {kWords, kRegex}) {
    spans.clear();
    const bool ok = (rail == kWords ? words_ : regex_).find_all(text, from, spans);
    for (const TextSpan& s : spans) out.push_back({s.begin, s.end, rail, refuse_, mask_});
    if (!ok) return rail;
  }
  return -1;
}

std::string OutputFilter::push(std::string_view piece) {
  text_.append(piece);
  return release(false);
}

std::string OutputFilter::finish() {
  return release(true);
}

std::string OutputFilter::whole(std::string_view text) {
  text_.append(text);
  return release(true);
}

std::string OutputFilter::release(bool at_end) {
  if (refused_) return {};
  const std::string_view t = text_;
  const size_t window = rails_->window();
  // Bytes before `limit` have a full window after them.
  const size_t limit = at_end ? t.size() : back_chars(t, t.size(), window);
  if (!at_end && limit <= done_) return {};
  matches_.clear();
  const int limited = rails_->scan(t, back_chars(t, done_, window), matches_);
  if (limited >= 0) {
    refused_ = true;
    triggered_ |= 1u << unsigned(limited);
    return {};
  }
  // Leftmost first, the longer first at one start, then in rail order.
  std::sort(matches_.begin(), matches_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin
           : a.end != b.end   ? a.end > b.end
                              : a.rail < b.rail;
  });
  // A match is final once a full window follows it: more text cannot change it.
  auto final = [&](const OutputRails::Match& m) { return at_end || m.end <= limit; };
  for (const OutputRails::Match& m : matches_)
    if (m.refuse && m.end > done_ && final(m)) {
      refused_ = true;
      triggered_ |= 1u << unsigned(m.rail);
      return {};
    }
  // Nothing is released from where a match still open starts.
  size_t cut = limit;
  for (const OutputRails::Match& m : matches_)
    if (m.end > done_ && !final(m)) cut = std::min(cut, std::max(m.begin, done_));
  std::string out;
  size_t at = done_, kept_end = 0;
  for (const OutputRails::Match& m : matches_) {
    if (m.refuse || m.begin < kept_end) continue;  // overlaps a match that starts earlier
    kept_end = m.end;
    if (m.end <= done_) continue;  // released before
    if (!final(m) || m.begin >= cut) break;
    // A match begun in released text (longer than the window) loses its rest.
    const size_t b = std::max(m.begin, at);
    out.append(t.substr(at, b - at));
    out.append(m.replacement);
    at = m.end;
    triggered_ |= 1u << unsigned(m.rail);
  }
  if (at < cut) {
    out.append(t.substr(at, cut - at));
    at = cut;
  }
  done_ = at;
  return out;
}

}  // namespace nk
