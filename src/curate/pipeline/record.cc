#include "curate/pipeline/record.h"

#include <simdjson.h>

#include <fmt/format.h>

#include "data/jsonl_reader.h"
#include "data/utf8.h"

namespace nk::curate {

using ojson = nlohmann::ordered_json;

struct RecordParser::Impl {
  simdjson::dom::parser parser;
};

RecordParser::RecordParser(std::string text_key, std::string id_key)
    : text_key_(std::move(text_key)), id_key_(std::move(id_key)), impl_(std::make_unique<Impl>()) {}
RecordParser::~RecordParser() = default;

namespace {

ojson to_json(simdjson::dom::element e) {
  using T = simdjson::dom::element_type;
  switch (e.type()) {
    case T::ARRAY: {
      ojson a = ojson::array();
      simdjson::dom::array arr;
      if (e.get_array().get(arr)) return a;
      for (simdjson::dom::element x : arr) a.push_back(to_json(x));
      return a;
    }
    case T::OBJECT: {
      ojson o = ojson::object();
      simdjson::dom::object obj;
      if (e.get_object().get(obj)) return o;
      for (auto field : obj) o[std::string(field.key)] = to_json(field.value);
      return o;
    }
    case T::INT64:
      return e.get_int64().value_unsafe();
    case T::UINT64:
      return e.get_uint64().value_unsafe();
    case T::DOUBLE:
      return e.get_double().value_unsafe();
    case T::STRING:
      return std::string(e.get_string().value_unsafe());
    case T::BOOL:
      return e.get_bool().value_unsafe();
    case T::NULL_VALUE:
      return nullptr;
  }
  return nullptr;
}

}  // namespace

bool RecordParser::parse(std::string_view line, Document& doc, std::string& why) {
  constexpr size_t kKeepCapacity = size_t(64) << 20;  // give back what a huge line took
  if (impl_->parser.capacity() > kKeepCapacity && line.size() < kKeepCapacity)
    impl_ = std::make_unique<Impl>();
  simdjson::dom::element root;
  auto err = impl_->parser.parse(line.data(), line.size(), false).get(root);
  if (err == simdjson::UTF8_ERROR) {
    why = fmt::format("invalid UTF-8 at byte {} of the line", find_invalid_utf8(line));
    return false;
  }
  if (err) {
    why = fmt::format("invalid JSON: {}", simdjson::error_message(err));
    return false;
  }
  if (!root.is_object()) {
    why = "the line is not a JSON object";
    return false;
  }
  doc.id.clear();
  doc.text.clear();
  doc.meta = ojson::object();
  bool have_text = false;
  simdjson::dom::object obj;
  if (root.get_object().get(obj)) {
    why = "the line is not a JSON object";
    return false;
  }
  for (auto field : obj) {
    if (field.key == text_key_) {
      if (!field.value.is_string()) {
        why = fmt::format("\"{}\" is not a string", text_key_);
        return false;
      }
      doc.text = field.value.get_string().value_unsafe();
      have_text = true;
    } else if (field.key == id_key_) {
      if (field.value.is_string())
        doc.id = field.value.get_string().value_unsafe();
      else
        doc.id = simdjson::minify(field.value);
    } else {
      doc.meta[std::string(field.key)] = to_json(field.value);
    }
  }
  if (!have_text) {
    why = fmt::format("no key \"{}\"", text_key_);
    return false;
  }
  return true;
}

void append_json_string(std::string& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  out.push_back('"');
  size_t run = 0;  // start of the pending run of plain bytes
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default: {
        char esc[7] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15], 0};
        out.append(esc, 6);
      }
    }
  }
  out.append(s.data() + run, s.size() - run);
  out.push_back('"');
}

void append_record(std::string& out, const Document& doc, std::string_view removed_by,
                   std::string_view reason) {
  out += "{\"id\":";
  append_json_string(out, doc.id);
  out += ",\"text\":";
  append_json_string(out, doc.text);
  for (const auto& [key, value] : doc.meta.items()) {
    if (key == "id" || key == "text") continue;
    if (!removed_by.empty() && (key == "removed_by" || key == "reason")) continue;
    out.push_back(',');
    append_json_string(out, key);
    out.push_back(':');
    out += value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
  if (!removed_by.empty()) {
    out += ",\"removed_by\":";
    append_json_string(out, removed_by);
    out += ",\"reason\":";
    append_json_string(out, reason);
  }
  out += "}\n";
}

}  // namespace nk::curate
