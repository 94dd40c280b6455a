// NCCL opened at run time (dist/nccl/nccl_api.h): no GPU needed, only the
// library where the build found it. Compiled only with -DNK_WITH_NCCL=ON.
#ifdef NK_WITH_NCCL
#include "dist/nccl/nccl_api.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace nk::dist::nccl {
namespace {

using test::contains;

TEST(NcclApi, OpensTheBuildsNcclAndResolvesEveryCall) {
  const NcclApi& a = nccl_api();
  EXPECT_TRUE(contains(a.library, "libnccl.so." + std::to_string(NCCL_MAJOR))) << a.library;
  EXPECT_GE(a.version, 20000);  // 2.x
  EXPECT_EQ(&nccl_api(), &a);   // opened once
#define NK_NCCL_SET(fn) EXPECT_NE(a.fn, nullptr) << #fn;
  NK_NCCL_CALLS(NK_NCCL_SET)
#undef NK_NCCL_SET
  // A call through the table: the library's own text for an error code.
  EXPECT_TRUE(contains(a.ncclGetErrorString(ncclInvalidArgument), "invalid argument"))
      << a.ncclGetErrorString(ncclInvalidArgument);
}

TEST(NcclApi, AMissingLibraryIsAnErrorNamingEveryCandidate) {
  try {
    load_nccl({"libnccl_absent.so.2", "/nonexistent/libnccl.so.2"});
    FAIL() << "loaded a library that does not exist";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "cannot open the library the NCCL communicator needs")) << m;
    EXPECT_TRUE(contains(m, "LD_LIBRARY_PATH")) << m;
    EXPECT_TRUE(contains(m, "libnccl_absent.so.2")) << m;
    EXPECT_TRUE(contains(m, "/nonexistent/libnccl.so.2")) << m;
  }
}

TEST(NcclApi, ALibraryWithoutNcclsCallsIsAnErrorNamingTheCall) {
  // libm opens, and has no ncclGetVersion.
  try {
    load_nccl({"libm.so.6"});
    FAIL() << "took libm for NCCL";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "libm.so.6 has no ncclGetVersion")) << m;
  }
}

}  // namespace
}  // namespace nk::dist::nccl
#endif
