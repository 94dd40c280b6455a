#include "dist/nccl/nccl_api.h"

#include <dlfcn.h>

#include "core/error.h"

namespace nk::dist::nccl {

NcclApi load_nccl(const std::vector<std::string>& candidates) {
  std::string why;
  for (const std::string& name : candidates) {
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      why += fmt::format("\n  {}: {}", name, dlerror());
      continue;
    }
    NcclApi a;
    a.library = name;
#define NK_NCCL_RESOLVE(fn)                                                                     \
  a.fn = reinterpret_cast<decltype(a.fn)>(dlsym(lib, #fn));                                     \
  if (!a.fn)                                                                                    \
    fail("NCCL: {} has no {} (an NCCL older than the build's headers, version {}?)", name, #fn, \
         NCCL_VERSION_CODE);
    NK_NCCL_CALLS(NK_NCCL_RESOLVE)
#undef NK_NCCL_RESOLVE
    if (a.ncclGetVersion(&a.version) != ncclSuccess) fail("NCCL: {}: ncclGetVersion failed", name);
    // NCCL_VERSION's codes: major x 1000 + minor x 100 + patch up to 2.8, major x 10000 after
    if ((a.version >= 10000 ? a.version / 10000 : a.version / 1000) != NCCL_MAJOR)
      fail("NCCL: {} is version {}, the build's headers {}.x", name, a.version, NCCL_MAJOR);
    return a;
  }
  fail(
      "NCCL: cannot open the library the NCCL communicator needs (install NCCL {}.x or "
      "name its folder in LD_LIBRARY_PATH); tried:{}",
      NCCL_MAJOR, why);
}

const NcclApi& nccl_api() {
  static const NcclApi a = [] {
    const std::string soname = "libnccl.so." + std::to_string(NCCL_MAJOR);
    std::vector<std::string> candidates{soname};
#ifdef NK_NCCL_DIR
    candidates.push_back(std::string(NK_NCCL_DIR) + "/" + soname);
#endif
    return load_nccl(candidates);
  }();
  return a;
}

}  // namespace nk::dist::nccl
