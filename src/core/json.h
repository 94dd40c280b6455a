// Parsing JSON text with errors that name the file and line: one helper for
// every JSON file Nekton reads (configs, tokenizer files, trainer state).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace nk {

// nk::Error "WHERE:LINE: not valid JSON (byte N): ..." on a syntax error.
nlohmann::json parse_json(const std::string& text, const std::string& where);
// As parse_json, and nk::Error "WHERE: expected a JSON object" unless it is one.
nlohmann::json parse_json_object(const std::string& text, const std::string& where);

}  // namespace nk
