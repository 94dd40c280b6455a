// Python's str operations the harness's definitions lean on, over UTF-8:
// isspace (bidirectional class WS, B or S, or category Zs), strip and
// rstrip without arguments, len() in code points, and
// len(re.split(r"\s+", s)), the harness's word count.
#pragma once
#include <cstdint>
#include <string>

namespace nk {

bool py_isspace(int32_t code_point);
std::string py_strip(const std::string& s);
std::string py_rstrip(const std::string& s);
int64_t code_points(const std::string& s);
int64_t count_words(const std::string& s);

}  // namespace nk
