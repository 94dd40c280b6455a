// Which test cases cover which kernels: each op test names, beside the case,
// the kernels of ops/kernel_list.h (or ops/cpu/cpu_only_kernel_list.h) that it
// runs and checks against the reference or a host computation:
//
//   NK_COVERS(Linear, MatchesReferenceF32, linear_forward, linear_backward);
//   TEST_P(Linear, MatchesReferenceF32) { ... }
//
// The line records those names into kernel_cases() during static
// initialisation; kernel_coverage_test.cc walks the kernel lists and fails for
// a kernel without a case that runs on every backend (a TEST_P instantiated by
// NK_INSTANTIATE_BACKENDS), for a name that is in no list, and for a case that
// is not a test of this binary.
#pragma once
#include <cctype>
#include <string>
#include <vector>

namespace nk::test {

struct KernelCase {
  std::string kernel;  // as written in the NK_COVERS line
  std::string suite, test;
  std::string where;  // file:line of the NK_COVERS line
};

// Every NK_COVERS line linked into this binary, in no particular order.
inline std::vector<KernelCase>& kernel_cases() {
  static std::vector<KernelCase> cases;
  return cases;
}

// One NK_COVERS line: `kernels` is its list of names as the preprocessor
// spells it ("a, b").
inline bool register_kernel_cases(const char* suite, const char* test, const char* kernels,
                                  const char* file, int line) {
  const std::string where = std::string(file) + ":" + std::to_string(line);
  std::string name;
  for (const char* p = kernels;; ++p) {
    if (*p == ',' || *p == '\0') {
      kernel_cases().push_back({name, suite, test, where});
      name.clear();
      if (*p == '\0') break;
    } else if (!std::isspace(static_cast<unsigned char>(*p))) {
      name += *p;
    }
  }
  return true;
}

}  // namespace nk::test

// `fixture.name` covers the kernels named after it (at least one). (Not
// `test` for a parameter: the expansion names the namespace nk::test.)
#define NK_COVERS(fixture, name, ...)                                  \
  [[maybe_unused]] static const bool nk_covers_##fixture##_##name##_ = \
      ::nk::test::register_kernel_cases(#fixture, #name, #__VA_ARGS__, __FILE__, __LINE__)
