// train.freeze: which parameters a run freezes, from glob patterns over the
// parameter names (`wte`, `h.*.attn.*`, `h.[0-3].*`; fnmatch syntax, `*`
// also crosses dots).
#pragma once
#include <string>
#include <vector>

#include "nn/param_layout.h"

namespace nk {

// The names (in layout order) matched by the comma-separated `patterns`; ""
// freezes nothing. nk::Error naming `key` and the pattern for an empty pattern
// or one that matches no parameter, and for patterns that freeze everything.
std::vector<std::string> match_frozen(const ParamLayout& layout, const std::string& patterns,
                                      const std::string& key);

// The frozen parameters of `layout`, comma-separated in layout order ("" if none).
std::string frozen_list(const ParamLayout& layout);

}  // namespace nk
