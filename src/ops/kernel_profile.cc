#include "ops/kernel_profile.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <utility>

#include "ops/cpu_kernels.h"
#include "ops/kernel_names.h"
#include "ops/moe.h"
#include "ops/ops.h"
#include "ops/quant.h"
#ifdef NK_WITH_CUDA
#include "core/cuda/runtime.h"
#include "ops/cuda_kernels.h"
#endif

namespace nk::ops {

namespace {

// The kernels' indices, in the order of the two X-macro lists (the order of
// kKernelNames then kCpuOnlyKernelNames).
enum ProfiledKernel : int {
#define NK_KERNEL_DECL(ret, name, params) kProfiled_##name,
#include "ops/kernel_list.h"
#define NK_KERNEL_DECL(ret, name, params) kProfiled_##name,
#include "ops/cpu/cpu_only_kernel_list.h"
  kProfiledCount
};

struct Counter {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> ns{0};
};
std::array<Counter, kProfiledCount> g_counters;

// The open calls of this thread: each one's time in calls nested in it, which
// its own time leaves out.
thread_local int64_t t_nested_ns = 0;

// The wrapper of kernel I: times the call, its self time into counter I.
template <int I, typename Fn>
struct Timed;
template <int I, typename R, typename... A>
struct Timed<I, R (*)(A...)> {
  static inline R (*real)(A...) = nullptr;
  static R call(A... a) {
    const int64_t outer_nested = std::exchange(t_nested_ns, 0);
    const auto t0 = std::chrono::steady_clock::now();
    struct Done {
      std::chrono::steady_clock::time_point t0;
      int64_t outer_nested;
      ~Done() {
        const int64_t total = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - t0)
                                  .count();
        g_counters[I].calls.fetch_add(1, std::memory_order_relaxed);
        g_counters[I].ns.fetch_add(total - t_nested_ns, std::memory_order_relaxed);
        t_nested_ns = outer_nested + total;
      }
    } done{t0, outer_nested};
    return real(std::forward<A>(a)...);
  }
};

// The active level's table with every entry replaced by its wrapper.
CpuKernels make_profiled(const CpuKernels& base) {
  CpuKernels k = base;
#define NK_KERNEL_DECL(ret, name, params)                          \
  if (base.name) {                                                 \
    using T = Timed<kProfiled_##name, decltype(CpuKernels::name)>; \
    T::real = base.name;                                           \
    k.name = &T::call;                                             \
  }
#include "ops/kernel_list.h"
#define NK_KERNEL_DECL(ret, name, params)                          \
  if (base.name) {                                                 \
    using T = Timed<kProfiled_##name, decltype(CpuKernels::name)>; \
    T::real = base.name;                                           \
    k.name = &T::call;                                             \
  }
#include "ops/cpu/cpu_only_kernel_list.h"
  return k;
}

#ifdef NK_WITH_CUDA
// CUDA kernels return before the device has run them, so each outermost call
// through the table is bracketed by two timing events on the compute stream
// and its time read once the device has passed both (drain_cuda): the
// device's time from the call's start to its end, which also counts the
// host's work inside the call while the device waits for it. A kernel called
// from another's call counts its call, its time in its caller's.
struct PendingCall {
  int kernel;
  std::unique_ptr<cuda::Event> start, stop;
};
std::mutex g_cuda_mu;
std::vector<PendingCall> g_pending;                // recorded, not yet read
std::vector<std::unique_ptr<cuda::Event>> g_free;  // read, for reuse
thread_local int t_cuda_depth = 0;

std::unique_ptr<cuda::Event> take_event() {
  std::lock_guard lock(g_cuda_mu);
  if (g_free.empty()) return std::make_unique<cuda::Event>(true);
  std::unique_ptr<cuda::Event> e = std::move(g_free.back());
  g_free.pop_back();
  return e;
}

// Waits for the device, adds every pending call's time to its counter.
void drain_cuda() {
  std::lock_guard lock(g_cuda_mu);
  if (g_pending.empty()) return;
  cuda::synchronize();
  for (PendingCall& c : g_pending) {
    g_counters[size_t(c.kernel)].ns.fetch_add(int64_t(double(c.stop->elapsed_ms(*c.start)) * 1e6),
                                              std::memory_order_relaxed);
    g_free.push_back(std::move(c.start));
    g_free.push_back(std::move(c.stop));
  }
  g_pending.clear();
}

template <int I, typename Fn>
struct CudaTimed;
template <int I, typename R, typename... A>
struct CudaTimed<I, R (*)(A...)> {
  static inline R (*real)(A...) = nullptr;
  static R call(A... a) {
    g_counters[I].calls.fetch_add(1, std::memory_order_relaxed);
    if (t_cuda_depth > 0) return real(std::forward<A>(a)...);
    bool full;
    {
      std::lock_guard lock(g_cuda_mu);
      full = g_pending.size() >= 8192;  // a bound on the events held
    }
    if (full) drain_cuda();
    PendingCall c{I, take_event(), take_event()};
    c.start->record(cuda::stream());
    struct Done {
      PendingCall& c;
      ~Done() {
        --t_cuda_depth;
        try {
          c.stop->record(cuda::stream());
          std::lock_guard lock(g_cuda_mu);
          g_pending.push_back(std::move(c));
        } catch (...) {  // the device's error resurfaces at its next call
        }
      }
    } done{c};
    ++t_cuda_depth;
    return real(std::forward<A>(a)...);
  }
};

CudaKernels make_profiled_cuda(const CudaKernels& base) {
  CudaKernels k = base;
#define NK_KERNEL_DECL(ret, name, params)                               \
  {                                                                     \
    using T = CudaTimed<kProfiled_##name, decltype(CudaKernels::name)>; \
    T::real = base.name;                                                \
    k.name = &T::call;                                                  \
  }
#include "ops/kernel_list.h"
  return k;
}
#endif

std::string_view profiled_name(int i) {
  constexpr int n = int(std::size(kKernelNames));
  return i < n ? kKernelNames[i] : kCpuOnlyKernelNames[i - n];
}

}  // namespace

void set_kernel_profiling(bool on) {
  static const CpuKernels profiled = make_profiled(cpu_kernels_for(active_cpu_isa()));
  set_cpu_kernels(on ? &profiled : nullptr);
#ifdef NK_WITH_CUDA
  static const CudaKernels profiled_cuda = make_profiled_cuda(cuda_kernel_table());
  set_cuda_kernels(on ? &profiled_cuda : nullptr);
#endif
}

bool kernel_profiling() {
  return cpu_kernels_overridden();
}

std::vector<KernelTime> kernel_profile() {
#ifdef NK_WITH_CUDA
  drain_cuda();
#endif
  std::vector<KernelTime> out;
  for (int i = 0; i < kProfiledCount; ++i)
    if (const int64_t calls = g_counters[size_t(i)].calls.load(std::memory_order_relaxed))
      out.push_back({profiled_name(i), calls,
                     double(g_counters[size_t(i)].ns.load(std::memory_order_relaxed)) * 1e-9});
  std::sort(out.begin(), out.end(),
            [](const KernelTime& a, const KernelTime& b) { return a.seconds > b.seconds; });
  return out;
}

void reset_kernel_profile() {
#ifdef NK_WITH_CUDA
  drain_cuda();
#endif
  for (Counter& c : g_counters) {
    c.calls.store(0, std::memory_order_relaxed);
    c.ns.store(0, std::memory_order_relaxed);
  }
}

}  // namespace nk::ops
