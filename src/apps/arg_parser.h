// Positional arguments and --options of the commands that take them
// (tokenizer, import, export, curate train-classifier). Options are declared
// as config keys are (core/config_bind.h), each bound to its field with its
// doc in one line:
//   cl.bind("--count", count, "tokens listed");
// A bool is a flag; a std::vector<std::string> takes several values
// (--input a b c); anything else one value, `--opt v` or `--opt=v` (given
// twice, the last wins). Errors name the command and the option; an unknown
// option names the nearest declared one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config_bind.h"

namespace nk {

class CommandLine : public ConfigBinder {
 public:
  // Parses args[from..] for `command` ("tokenizer encode", for messages).
  CommandLine(std::string command, std::vector<std::string> args, size_t from);

  using ConfigBinder::bind;
  bool bind(const std::string& option, std::vector<std::string>& field, const std::string& doc);

  // --help or -h among the arguments: binds only declare, for help_text().
  bool help() const { return help_; }
  bool reading() const override { return !help_; }
  // Whether `option` is among the arguments.
  bool has(const std::string& option) const;
  // After every bind: nk::Error for an option no bind declared; the
  // positional arguments ("-5" and "-" alone are positional too).
  std::vector<std::string> finish() const;
  // `usage`, then each option with its value's type, doc and default.
  std::string help_text(const std::string& usage) const;

 protected:
  std::optional<GivenValue> given(const ConfigSchema::Field& key) override;
  std::string name_of(const std::string& key) const override { return "option " + key; }

 private:
  // Marks the arguments of every `option` used and returns its values; false
  // when it is not given. `values`: 0 (a flag), 1 or -1 (all that follow).
  bool take(const std::string& option, int values, std::vector<std::string>& out);

  std::string command_;
  std::vector<std::string> args_;
  std::vector<bool> used_;
  size_t from_;
  bool help_ = false;
};

// nk::Error "WHAT: 'S' is not an integer / a number".
int64_t parse_int(const std::string& s, const std::string& what);
double parse_double(const std::string& s, const std::string& what);

}  // namespace nk
