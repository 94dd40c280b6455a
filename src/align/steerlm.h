// SteerLM (NeMo-Aligner's recipe): attribute-conditioned fine-tuning. Each
// response's attribute values (HelpSteer's helpfulness, correctness,
// coherence, complexity, verbosity, 0..4) are written into its prompt as
// NeMo's label string "helpfulness:4,correctness:3,...", so that generation
// can ask for chosen values. The one rendering here serves data preparation
// (`nekton align align.method=steerlm`) and generation (`nekton generate
// generate.steerlm_attributes=...`), so training and inference agree byte
// for byte.
//
// Where the string goes: a chat prompt gets it as its system message (in
// front of the prompt's own system text, on its own line); a string prompt
// gets it as a prefix line. `prompt_template` shapes it ("{attributes}" by
// default; NeMo's Megatron chat form would be "<extra_id_2>{attributes}").
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/chat/chat_template.h"

namespace nk {

// The attributes a model is conditioned on, in the order the string lists them.
struct SteerLmSpec {
  std::vector<std::string> names;
  int64_t min_value = 0, max_value = 4;  // each value an integer in [min, max]
  std::string prompt_template = "{attributes}";

  // nk::Error naming `key` for no names, an empty or repeated name, a name
  // holding ':' ',' or white space, min > max, or a template without
  // "{attributes}".
  void check(const std::string& key) const;
  // {"attributes": [...], "min": , "max": , "template": } (steerlm.json
  // beside a trained model) and back; nk::Error naming `where`.
  nlohmann::json to_json() const;
  static SteerLmSpec from_json(const nlohmann::json& j, const std::string& where);
};

// HelpSteer's five attributes, NeMo-Aligner's SteerLM 2.0 default.
std::vector<std::string> helpsteer_attributes();

// "a,b, c" as names (empty items dropped).
std::vector<std::string> split_attribute_names(const std::string& list);

// One value per spec name: "helpfulness:4,correctness:3,..." in spec order.
std::string attribute_string(const SteerLmSpec& spec, const std::vector<int64_t>& values);

// A label string "name:value,..." (any order, white space around items
// allowed) as one value per spec name; nk::Error naming `where` for a name
// not in the spec, a repeated or missing one, a value that is not an integer
// or outside [min, max]. With allow_missing, missing names are nullopt.
std::vector<std::optional<int64_t>> parse_attribute_string(const SteerLmSpec& spec,
                                                           const std::string& s,
                                                           const std::string& where,
                                                           bool allow_missing = false);

// A value from an attribute model's score: rounded, then clipped to the range.
int64_t attribute_value(const SteerLmSpec& spec, double score);

// The conditioned prompt: a string prompt with the rendered template and a
// newline in front; a chat prompt (messages) with it as the system message
// (the prompt's own system message, if it opens with one, follows on the
// next line). nk::Error naming `where` for a prompt of another kind.
nlohmann::json steerlm_prompt(const SteerLmSpec& spec, const std::string& attributes,
                              const nlohmann::json& prompt, const std::string& where);

// steerlm_prompt's rule for messages as a server holds them (each one's
// other keys kept): the same system message, built by the same function.
std::vector<ChatMessage> steerlm_messages(const SteerLmSpec& spec, const std::string& attributes,
                                          const std::vector<ChatMessage>& messages);

// DIR/steerlm.json (what align.method=steerlm writes beside the trained
// model), or nullopt without one. nk::Error naming the file if malformed.
std::optional<SteerLmSpec> read_steerlm_spec(const std::string& model_dir);

// Generation's side: `values` ("name:value,..." in any order) checked
// against the spec (every attribute, each in range), written in the spec's
// order with attribute_string and put into `prompt` by steerlm_prompt, just
// as data preparation wrote the training prompts. nk::Error naming `key`.
nlohmann::json steerlm_condition(const SteerLmSpec& spec, const std::string& values,
                                 const nlohmann::json& prompt, const std::string& key);

// The spec a model was trained with (read_steerlm_spec), else one taking the
// names of `values` in their order with any integer value; `prompt_template`
// ("" = the spec's, else "{attributes}") replaces the template.
SteerLmSpec steerlm_spec_for(const std::string& model_dir, const std::string& values,
                             const std::string& prompt_template, const std::string& key);

}  // namespace nk
