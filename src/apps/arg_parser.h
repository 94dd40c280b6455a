// Positional arguments and --options for the commands that take them
// (tokenizer, import, export), with errors that name the command and option.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace nk {

// How many values an option takes.
enum class Arity { kFlag, kOne, kMany };

struct Parsed {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> values;  // options given, with values
  bool has(const std::string& k) const { return values.count(k) > 0; }
  const std::string& one(const std::string& k) const { return values.at(k).back(); }
};

// Parses args[from..]: `--opt value`, `--opt=value`, flags; anything else is
// positional ("-5" is positional, "-" alone too). nk::Error naming `command`
// for an unknown option, a flag given a value or an option missing its value.
Parsed parse_options(const std::string& command, const std::vector<std::string>& args, size_t from,
                     const std::map<std::string, Arity>& options);

// nk::Error "WHAT: 'S' is not an integer / a number".
int64_t parse_int(const std::string& s, const std::string& what);
double parse_double(const std::string& s, const std::string& what);

}  // namespace nk
