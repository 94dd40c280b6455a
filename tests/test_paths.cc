#include "test_paths.h"

// CMakeLists.txt defines both for this file alone (the nk_test_paths library).
namespace nk::test {
const char* const kSourceDir = NK_TEST_SOURCE_DIR;
const char* const kBinaryDir = NK_TEST_BINARY_DIR;
}  // namespace nk::test
