// Documents to and from JSON Lines. A record is a JSON object: the text field
// becomes Document::text, the id field (string or number) Document::id, and
// every other field goes to Document::meta in its order. Written back, a
// record is {"id": ..., "text": ..., <meta fields>}.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "curate/document.h"

namespace nk::curate {

class RecordParser {
 public:
  RecordParser(std::string text_key, std::string id_key);
  ~RecordParser();
  RecordParser(const RecordParser&) = delete;
  RecordParser& operator=(const RecordParser&) = delete;

  // Parses one line (followed by nk::kJsonPadding readable bytes). False with
  // `why` set for invalid JSON, a line that is not an object, a missing or
  // non-string text field, or invalid UTF-8 (why says where). A missing id
  // leaves doc.id empty for the caller to fill.
  bool parse(std::string_view line, Document& doc, std::string& why);

 private:
  std::string text_key_, id_key_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Appends `s` (valid UTF-8) as a JSON string literal, quotes included.
void append_json_string(std::string& out, std::string_view s);

// Appends the record of `doc` and a '\n'. `removed_by`/`reason`, when
// non-empty, are added as the last two fields (the removed-documents JSONL).
void append_record(std::string& out, const Document& doc, std::string_view removed_by = {},
                   std::string_view reason = {});

}  // namespace nk::curate
