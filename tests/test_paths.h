// Where the tests find the tree's files (NK_SOURCE_DIR) and write their
// scratch files (NK_BINARY_DIR): the source and build folders. Both are
// compiled into one object, tests/test_paths.cc, so that no other test
// object holds an absolute path and ccache (Makefile) serves every other one
// to a clone of the same commit in another folder, CI's among them.
#pragma once

namespace nk::test {
extern const char* const kSourceDir;
extern const char* const kBinaryDir;
}  // namespace nk::test

#define NK_SOURCE_DIR (::nk::test::kSourceDir)
#define NK_BINARY_DIR (::nk::test::kBinaryDir)
