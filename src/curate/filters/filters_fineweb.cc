// FineWeb quality rules.
//
// Source of every default and key name: datatrove's FineWebQualityFilter
// (Penedo et al. 2024, "The FineWeb Datasets"): line_punct_thr 0.12,
// short_line_thr 0.67 with short_line_length 30, char_duplicates_ratio 0.01,
// new_line_ratio 0.3. Lines are str.split("\n") (blank lines included, as
// the thresholds were tuned with them); lengths are code points.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "curate/filters/filters.h"
#include "curate/words.h"

namespace nk::curate {

namespace {

bool is_blank(std::string_view l) {
  return std::all_of(l.begin(), l.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
  });
}

}  // namespace

void TerminalPunctuationRule::read(StageConfig& c) {
  read_ratio(c, "line_punct_thr", threshold,
             "remove at this fraction of lines with terminal punctuation or less");
  c.bind("line_punct_exclude_zero", exclude_zero, "keep documents with no such line at all");
}

Reason TerminalPunctuationRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return std::string("terminal_punctuation: no words");
  const auto& lines = v.lines();
  size_t hit = 0;
  for (std::string_view l : lines) hit += ends_in_terminal_punctuation(l) ? 1 : 0;
  double r = double(hit) / double(lines.size());
  if (r <= threshold && !(r == 0 && exclude_zero))
    return fmt::format("terminal_punctuation_lines {} <= {}", ratio_str(r), threshold);
  return {};
}

void ShortLinesRule::read(StageConfig& c) {
  read_ratio(c, "short_line_thr", threshold, "remove at this fraction of short lines or more");
  c.bind("short_line_length", max_length, "longest short line (code points)");
  if (max_length < 0) c.fail_key("short_line_length", "must be >= 0");
}

Reason ShortLinesRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return std::string("short_lines: no words");
  const auto& lines = v.lines();
  size_t hit = 0;
  for (std::string_view l : lines) {
    // Code points only matter when the byte length is over the limit.
    bool short_line = int64_t(l.size()) <= max_length || int64_t(utf8_length(l)) <= max_length;
    hit += short_line ? 1 : 0;
  }
  double r = double(hit) / double(lines.size());
  if (r >= threshold) return fmt::format("short_lines {} >= {}", ratio_str(r), threshold);
  return {};
}

void CharDuplicatesRule::read(StageConfig& c) {
  read_ratio(c, "char_duplicates_ratio", threshold,
             "remove at this fraction of characters in duplicated lines or more");
}

// Code points of repeated non-blank lines (after each first occurrence) over
// the code points of the text without its newlines.
Reason CharDuplicatesRule::check(const Document&, TextView& v, Counters&) const {
  if (v.words().empty()) return std::string("char_duplicates: no words");
  thread_local std::vector<std::string_view> lines;
  lines.clear();
  size_t newlines = 0;
  for (std::string_view l : v.lines())
    if (!is_blank(l)) lines.push_back(l);
  newlines = size_t(std::count(v.text().begin(), v.text().end(), '\n'));
  DupStats s = find_duplicates(lines);
  double r = double(s.dup_chars) / double(v.chars() - newlines);
  if (r >= threshold) return fmt::format("char_duplicates {} >= {}", ratio_str(r), threshold);
  return {};
}

void NewLineRatioRule::read(StageConfig& c) {
  c.bind("new_line_ratio", max_ratio, "most newlines per word kept");
  if (max_ratio < 0) c.fail_key("new_line_ratio", "must be >= 0");
}

Reason NewLineRatioRule::check(const Document&, TextView& v, Counters&) const {
  size_t words = v.words().size();
  if (words == 0) return std::string("new_line_ratio: no words");
  size_t newlines = size_t(std::count(v.text().begin(), v.text().end(), '\n'));
  double r = double(newlines) / double(words);
  if (r > max_ratio) return fmt::format("new_line_ratio {} > {}", ratio_str(r), max_ratio);
  return {};
}

}  // namespace nk::curate
