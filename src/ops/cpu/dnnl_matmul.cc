#include "ops/cpu/dnnl_matmul.h"

#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/error.h"
#include "core/parallel.h"
#include "ops/cpu/float_io.h"
#include "ops/cpu_isa.h"

namespace nk::ops::cpu {
namespace {

// The baseline's conversions: this file is compiled once, for the baseline.
using NK_CPU_NS::load;
using NK_CPU_NS::store;

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dt to_dnnl(DType t) {
  switch (t) {
    case DType::F32:
      return dt::f32;
    case DType::BF16:
      return dt::bf16;
    case DType::F16:
      return dt::f16;
    default:
      NK_CHECK(false, "dnnl_matmul: unsupported dtype {}", dtype_name(t));
  }
}

// One engine and stream for the process: CPU execution is synchronous and
// threads come from OpenMP's pool, which oneDNN shares with our kernels.
// The kernels' level is chosen first: NK_CPU_ISA caps oneDNN too, which it
// obeys only before its first primitive.
dnnl::engine& engine() {
  static dnnl::engine e = (active_cpu_isa(), dnnl::engine(dnnl::engine::kind::cpu, 0));
  return e;
}
dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

std::atomic<bool> g_force_fallback{false};

using Key =
    std::tuple<int64_t, int64_t, int64_t, DType, DType, DType, DType, bool, bool, bool, bool, bool>;

Key key_of(const MatmulSpec& s, bool fallback) {
  return {s.m,
          s.n,
          s.k,
          s.a,
          s.b,
          s.c,
          s.has_bias ? s.bias : DType::F32,
          s.trans_a,
          s.trans_b,
          s.accumulate,
          s.has_bias,
          fallback};
}

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias;
  // Set where this CPU has no 16-bit matmul (oneDNN 2.x wants AVX-512 for
  // bf16), or for bf16 below the avx512_bf16 level (widen_bf16): the
  // primitive is the f32 one, run on f32 copies of the 16-bit
  // operands, with the result rounded back (round to nearest even), which is
  // what the 16-bit primitive computes too (f32 accumulation), up to the
  // order of the sums. The copies are kept with the entry: no allocation
  // after the first call.
  bool emulated = false;
  std::vector<float> fa, fb, fc, fbias;
};

Entry create_native(const MatmulSpec& s) {
  Entry e;
  e.a = dnnl::memory::desc({s.m, s.k}, to_dnnl(s.a), s.trans_a ? tag::ba : tag::ab);
  e.b = dnnl::memory::desc({s.k, s.n}, to_dnnl(s.b), s.trans_b ? tag::ba : tag::ab);
  e.c = dnnl::memory::desc({s.m, s.n}, to_dnnl(s.c), tag::ab);
  dnnl::primitive_attr attr;
  if (s.accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::desc d = [&] {
    if (!s.has_bias) return dnnl::matmul::desc(e.a, e.b, e.c);
    e.bias = dnnl::memory::desc({1, s.n}, to_dnnl(s.bias), tag::ab);
    return dnnl::matmul::desc(e.a, e.b, e.bias, e.c);
  }();
  e.prim = dnnl::matmul(dnnl::matmul::primitive_desc(d, attr, engine()));
  return e;
}

// Whether a bf16 operand should run as f32 on converted copies even where
// oneDNN would take it: below the avx512_bf16 level oneDNN 2.x emulates
// bf16 products on AVX-512 at under half its f32 rate (measured on GPT-2
// 124M's step: 96 tokens/s against 255 for f32 at NK_CPU_ISA=avx512), so
// the widened f32 product, conversions included, is the faster one.
bool widen_bf16() {
  static const bool w = active_cpu_isa() < CpuIsa::Avx512Bf16;
  return w;
}

Entry create(const MatmulSpec& s, bool force_fallback) {
  const bool low = s.a != DType::F32 || s.b != DType::F32 || s.c != DType::F32 ||
                   (s.has_bias && s.bias != DType::F32);
  const bool bf16 = s.a == DType::BF16 || s.b == DType::BF16 || s.c == DType::BF16 ||
                    (s.has_bias && s.bias == DType::BF16);
  if (bf16 && widen_bf16()) force_fallback = true;
  if (!low || !force_fallback) try {
      return create_native(s);
    } catch (const dnnl::error&) {
      if (!low) throw;
    }
  MatmulSpec f = s;
  f.a = f.b = f.c = f.bias = DType::F32;
  Entry e = create_native(f);
  e.emulated = true;
  if (s.a != DType::F32) e.fa.resize(size_t(s.m * s.k));
  if (s.b != DType::F32) e.fb.resize(size_t(s.k * s.n));
  if (s.c != DType::F32) e.fc.resize(size_t(s.m * s.n));
  if (s.has_bias && s.bias != DType::F32) e.fbias.resize(size_t(s.n));
  return e;
}

// n elements of dtype `t` at p -> f32 at out (same layout).
void widen(DType t, const void* p, float* out, int64_t n) {
  dispatch_float(t, "dnnl_matmul", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(p);
    parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = load(x[i]);
    });
  });
}

void narrow(DType t, const float* x, void* p, int64_t n) {
  dispatch_float(t, "dnnl_matmul", [&](auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(p);
    parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[i] = store<T>(x[i]);
    });
  });
}

struct Cache {
  std::mutex mu;
  std::map<Key, Entry> entries;  // node-based: references stay valid after inserts
};
Cache& cache() {
  static Cache c;
  return c;
}

Entry& lookup(const MatmulSpec& s) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const bool fallback = g_force_fallback.load();
  auto k = key_of(s, fallback);
  auto it = c.entries.find(k);
  if (it == c.entries.end()) it = c.entries.emplace(k, create(s, fallback)).first;
  return it->second;
}

}  // namespace

void dnnl_matmul(const MatmulSpec& s, const void* a, const void* b, void* c, const void* bias) {
  NK_CHECK(s.m > 0 && s.n > 0 && s.k > 0, "dnnl_matmul: empty product {}x{}x{}", s.m, s.k, s.n);
  NK_CHECK(s.has_bias == (bias != nullptr), "dnnl_matmul: bias pointer/spec mismatch");
  Entry& e = lookup(s);
  if (e.emulated) {  // f32 stand-ins for the 16-bit operands
    auto in = [](std::vector<float>& buf, DType t, const void* p) -> const void* {
      if (buf.empty()) return p;
      widen(t, p, buf.data(), int64_t(buf.size()));
      return buf.data();
    };
    a = in(e.fa, s.a, a);
    b = in(e.fb, s.b, b);
    if (bias) bias = in(e.fbias, s.bias, bias);
    if (!e.fc.empty() && s.accumulate) widen(s.c, c, e.fc.data(), int64_t(e.fc.size()));
  }
  void* out = e.emulated && !e.fc.empty() ? e.fc.data() : c;
  // Memory objects only wrap our pointers (no data allocation).
  auto wrap = [](const dnnl::memory::desc& md, const void* p) {
    return dnnl::memory(md, engine(), const_cast<void*>(p));
  };
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, wrap(e.a, a)},
                                             {DNNL_ARG_WEIGHTS, wrap(e.b, b)},
                                             {DNNL_ARG_DST, wrap(e.c, out)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, wrap(e.bias, bias));
  e.prim.execute(stream(), args);
  stream().wait();
  if (out != c) narrow(s.c, e.fc.data(), c, int64_t(e.fc.size()));
}

void dnnl_matmul_force_fallback(bool on) {
  g_force_fallback.store(on);
}

size_t dnnl_matmul_cache_size() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.entries.size();
}

}  // namespace nk::ops::cpu
