#include "ops/cpu/dnnl_matmul.h"

#include <atomic>
#include <list>
#include <map>
#include <memory>
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

using Key = std::tuple<int64_t, int64_t, int64_t, DType, DType, DType, DType, bool, bool, bool,
                       bool, bool, int64_t>;

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
          fallback,
          s.lda};
}

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias;
  // Set where this CPU has no 16-bit matmul (oneDNN 2.x wants AVX-512 for
  // bf16), or for bf16 below the avx512_bf16 level (widen_bf16): the
  // primitive is the f32 one, run on f32 copies of the 16-bit
  // operands, with the result rounded back (round to nearest even), which is
  // what the 16-bit primitive computes too (f32 accumulation), up to the
  // order of the sums. The copies go in the calling thread's scratch
  // (Scratch), grown to the largest product it has run, not kept per entry:
  // shapes that change every call (a MoE layer's experts' rows) would
  // otherwise keep a copy of their operands each.
  bool emulated = false;
  int64_t na = 0, nb = 0, nc = 0, nbias = 0;  // elements of each copy (0: none)
};

// A thread's f32 copies of an emulated product's 16-bit operands.
struct Scratch {
  std::vector<float> a, b, c, bias;
};
float* scratch(std::vector<float>& v, int64_t n) {
  if (v.size() < size_t(n)) v.resize(size_t(n));
  return v.data();
}

Entry create_native(const MatmulSpec& s) {
  Entry e;
  using dims = dnnl::memory::dims;
  e.a = s.lda == 0 ? dnnl::memory::desc({s.m, s.k}, to_dnnl(s.a), s.trans_a ? tag::ba : tag::ab)
                   : dnnl::memory::desc({s.m, s.k}, to_dnnl(s.a),
                                        s.trans_a ? dims{1, s.lda} : dims{s.lda, 1});
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

bool low_precision(const MatmulSpec& s) {
  return s.a != DType::F32 || s.b != DType::F32 || s.c != DType::F32 ||
         (s.has_bias && s.bias != DType::F32);
}

// Whether s runs as f32 on converted copies by choice (forced, or bf16 below
// the avx512_bf16 level); create may also fall back where oneDNN has no
// 16-bit product.
bool widened(const MatmulSpec& s, bool force_fallback) {
  const bool bf16 = s.a == DType::BF16 || s.b == DType::BF16 || s.c == DType::BF16 ||
                    (s.has_bias && s.bias == DType::BF16);
  return low_precision(s) && (force_fallback || (bf16 && widen_bf16()));
}

Entry create(const MatmulSpec& s, bool force_fallback) {
  const bool low = low_precision(s);
  force_fallback = widened(s, force_fallback);
  if (!low || !force_fallback) try {
      return create_native(s);
    } catch (const dnnl::error&) {
      if (!low) throw;
    }
  MatmulSpec f = s;
  f.a = f.b = f.c = f.bias = DType::F32;
  Entry e = create_native(f);
  e.emulated = true;
  if (s.a != DType::F32)  // (the span A's rows cover, with their stride)
    e.na = s.lda == 0 ? s.m * s.k : s.trans_a ? (s.k - 1) * s.lda + s.m : (s.m - 1) * s.lda + s.k;
  if (s.b != DType::F32) e.nb = s.k * s.n;
  if (s.c != DType::F32) e.nc = s.m * s.n;
  if (s.has_bias && s.bias != DType::F32) e.nbias = s.n;
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

// The primitives, the most recently used first; at most `capacity` of them
// (oneDNN's own primitive cache keeps 1024 by default). A training step's
// products repeat every step and stay; shapes that change every call (a MoE
// layer's experts' rows, prompts of every length) would otherwise add
// primitives for as long as the process runs.
struct Cache {
  struct Node {
    std::shared_ptr<Entry> entry;  // shared: an evicted entry lives on while in use
    std::list<Key>::iterator use;
  };
  std::mutex mu;
  std::map<Key, Node> entries;
  std::list<Key> uses;  // most recent first
  size_t capacity = 1024;
  void trim() {
    while (entries.size() > capacity) {
      entries.erase(uses.back());
      uses.pop_back();
    }
  }
};
Cache& cache() {
  static Cache c;
  return c;
}

std::shared_ptr<Entry> lookup(const MatmulSpec& s) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const bool fallback = g_force_fallback.load();
  auto k = key_of(s, fallback);
  auto it = c.entries.find(k);
  if (it != c.entries.end()) {
    c.uses.splice(c.uses.begin(), c.uses, it->second.use);
    return it->second.entry;
  }
  auto e = std::make_shared<Entry>(create(s, fallback));
  c.uses.push_front(k);
  c.entries.emplace(k, Cache::Node{e, c.uses.begin()});
  c.trim();
  return e;
}

}  // namespace

void dnnl_matmul(const MatmulSpec& s, const void* a, const void* b, void* c, const void* bias) {
  NK_CHECK(s.m > 0 && s.n > 0 && s.k > 0, "dnnl_matmul: empty product {}x{}x{}", s.m, s.k, s.n);
  NK_CHECK(s.has_bias == (bias != nullptr), "dnnl_matmul: bias pointer/spec mismatch");
  // Many rows, not a multiple of 64: the multiple of 64 and the rest apart
  // (dnnl_matmul.h). Each element of C is the same sum up to the order
  // oneDNN's blocking picks, which depends on M anyway (a scratch check: the
  // 4133 and 4161 rows split gave the first rows of the 4160 and 4224 row
  // products bit for bit at avx512 and avx512_bf16; at avx2 f32 they differ
  // in the last bits, as an unsplit bf16-on-f32 product of 4133 rows does
  // there; 20 training steps of a 5003-token vocabulary gave the same bits
  // as before at both levels). Not a product run on f32 copies: each part would copy the whole
  // span of A's strided rows (all of dy for the head's 17 last rows).
  constexpr int64_t kRowBlock = 64, kSplitRows = 4096;
  if (s.m >= kSplitRows && s.m % kRowBlock && !widened(s, g_force_fallback.load())) {
    MatmulSpec head = s, tail = s;
    head.lda = tail.lda = s.lda ? s.lda : s.trans_a ? s.m : s.k;
    head.m = s.m / kRowBlock * kRowBlock;
    tail.m = s.m - head.m;
    const int64_t a_at = (s.trans_a ? head.m : head.m * head.lda) * int64_t(dtype_size(s.a));
    dnnl_matmul(head, a, b, c, bias);
    dnnl_matmul(tail, static_cast<const char*>(a) + a_at, b,
                static_cast<char*>(c) + head.m * s.n * int64_t(dtype_size(s.c)), bias);
    return;
  }
  const std::shared_ptr<Entry> held = lookup(s);
  const Entry& e = *held;
  thread_local Scratch t;
  float* fc = e.nc ? scratch(t.c, e.nc) : nullptr;
  if (e.emulated) {  // f32 stand-ins for the 16-bit operands
    auto in = [](std::vector<float>& buf, int64_t n, DType dt, const void* p) -> const void* {
      if (n == 0) return p;
      float* f = scratch(buf, n);
      widen(dt, p, f, n);
      return f;
    };
    a = in(t.a, e.na, s.a, a);
    b = in(t.b, e.nb, s.b, b);
    if (bias) bias = in(t.bias, e.nbias, s.bias, bias);
    if (fc && s.accumulate) widen(s.c, c, fc, e.nc);
  }
  void* out = fc ? fc : c;
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
  if (out != c) narrow(s.c, fc, c, e.nc);
}

void dnnl_matmul_force_fallback(bool on) {
  g_force_fallback.store(on);
}

size_t dnnl_matmul_cache_size() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.entries.size();
}

size_t dnnl_matmul_set_cache_capacity(size_t n) {
  NK_CHECK(n > 0, "dnnl_matmul_set_cache_capacity: 0");
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const size_t old = c.capacity;
  c.capacity = n;
  c.trim();
  return old;
}

}  // namespace nk::ops::cpu
