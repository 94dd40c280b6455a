// NCCL's entry points, opened with dlopen when the first NCCL communicator is
// made, not linked: a build with NCCL then starts on a node without it (a
// CPU-only node of a mixed cluster, a container image without the CUDA
// libraries) and fails only when an NCCL communicator is made, saying
// which library it could not open. The pointers' types come from the build's
// nccl.h, so a call through them is checked as a direct call is.
#pragma once
#include <nccl.h>

#include <string>
#include <vector>

namespace nk::dist::nccl {

#define NK_NCCL_CALLS(X)    \
  X(ncclGetVersion)         \
  X(ncclGetUniqueId)        \
  X(ncclCommInitRankConfig) \
  X(ncclCommAbort)          \
  X(ncclCommDestroy)        \
  X(ncclCommGetAsyncError)  \
  X(ncclGetErrorString)     \
  X(ncclGetLastError)       \
  X(ncclAllReduce)          \
  X(ncclReduceScatter)      \
  X(ncclAllGather)          \
  X(ncclReduce)             \
  X(ncclBroadcast)          \
  X(ncclSend)               \
  X(ncclRecv)               \
  X(ncclGroupStart)         \
  X(ncclGroupEnd)

struct NcclApi {
  std::string library;  // the file opened, as dlopen was given it
  int version = 0;      // ncclGetVersion's: 22807 for 2.28.7
#define NK_NCCL_POINTER(name) decltype(&::name) name = nullptr;
  NK_NCCL_CALLS(NK_NCCL_POINTER)
#undef NK_NCCL_POINTER
};

// The first of `candidates` (sonames for the loader's search, or paths) that
// opens, resolved. nk::Error naming every candidate and the loader's reason
// when none opens, or the library and the entry point it lacks (an NCCL
// older than the build's headers), or a major version other than the
// headers'.
NcclApi load_nccl(const std::vector<std::string>& candidates);

// The process's NCCL: libnccl.so.<the headers' major> by the loader's search
// path (LD_LIBRARY_PATH, the cache), then in the folder the build found it
// in; opened on first call.
const NcclApi& nccl_api();

}  // namespace nk::dist::nccl
