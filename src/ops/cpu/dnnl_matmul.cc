#include "ops/cpu/dnnl_matmul.h"

#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/error.h"

namespace nk::ops::cpu {
namespace {

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
dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

using Key =
    std::tuple<int64_t, int64_t, int64_t, DType, DType, DType, DType, bool, bool, bool, bool>;

Key key_of(const MatmulSpec& s) {
  return {s.m,       s.n,       s.k,          s.a,       s.b, s.c, s.has_bias ? s.bias : DType::F32,
          s.trans_a, s.trans_b, s.accumulate, s.has_bias};
}

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias;
};

Entry create(const MatmulSpec& s) {
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

struct Cache {
  std::mutex mu;
  std::map<Key, Entry> entries;  // node-based: references stay valid after inserts
};
Cache& cache() {
  static Cache c;
  return c;
}

const Entry& lookup(const MatmulSpec& s) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto k = key_of(s);
  auto it = c.entries.find(k);
  if (it == c.entries.end()) it = c.entries.emplace(k, create(s)).first;
  return it->second;
}

}  // namespace

void dnnl_matmul(const MatmulSpec& s, const void* a, const void* b, void* c, const void* bias) {
  NK_CHECK(s.m > 0 && s.n > 0 && s.k > 0, "dnnl_matmul: empty product {}x{}x{}", s.m, s.k, s.n);
  NK_CHECK(s.has_bias == (bias != nullptr), "dnnl_matmul: bias pointer/spec mismatch");
  const Entry& e = lookup(s);
  // Memory objects only wrap our pointers (no data allocation).
  auto wrap = [](const dnnl::memory::desc& md, const void* p) {
    return dnnl::memory(md, engine(), const_cast<void*>(p));
  };
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, wrap(e.a, a)}, {DNNL_ARG_WEIGHTS, wrap(e.b, b)}, {DNNL_ARG_DST, wrap(e.c, c)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, wrap(e.bias, bias));
  e.prim.execute(stream(), args);
  stream().wait();
}

size_t dnnl_matmul_cache_size() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.entries.size();
}

}  // namespace nk::ops::cpu
