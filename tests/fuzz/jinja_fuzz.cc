// A chat template (data/jinja), parsed and rendered over a conversation with
// tools, as serving and fine-tuning render a model's own template. Syntax
// errors, raise_exception and the interpreter's step, nesting and size
// bounds are nk::Error; a crash, a hang or any other exception is a finding.
#include <nlohmann/json.hpp>

#include "data/jinja/template.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Weather in Oslo?"},
                 {"role": "assistant", "content": null, "tool_calls": [{"id": "call12345",
                   "type": "function", "function": {"name": "w", "arguments": {"city": "Oslo"}}}]},
                 {"role": "tool", "tool_call_id": "call12345", "content": "sunny"},
                 {"role": "assistant", "content": "Sunny."}],
    "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  return nk::fuzz::accept_errors([&] {
    const nk::jinja::Template t(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    t.render(context);
  });
}
