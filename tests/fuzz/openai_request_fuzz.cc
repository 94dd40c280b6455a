// A request body of the OpenAI server (`nekton serve`): parsed as chat and as
// completion requests, and as /tokenize and /detokenize bodies. ApiError (the
// 400 the server answers, always with a status in [400, 600)) is the parser
// refusing bad input, as nk::Error is elsewhere; anything else is a finding.
#include <cstdlib>

#include "fuzz/fuzz_util.h"
#include "serve/api_error.h"
#include "serve/openai_request.h"

namespace {

template <typename F>
void refused_or_parsed(F&& parse) {
  try {
    parse();
  } catch (const nk::ApiError& e) {
    if (e.status() < 400 || e.status() >= 600) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  return nk::fuzz::accept_errors([&] {
    refused_or_parsed([&] { nk::parse_completion_request(body, nk::ApiKind::Chat); });
    refused_or_parsed([&] { nk::parse_completion_request(body, nk::ApiKind::Completion); });
    refused_or_parsed([&] { nk::parse_tokenize_request(body); });
    refused_or_parsed([&] { nk::parse_detokenize_request(body); });
  });
}
