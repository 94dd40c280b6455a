// The cost of quantised weights in a linear layer: quant_linear_forward for
// one row of x (decode) and 128 rows (prefill) against linear_forward on
// dense f32 and bf16 weights of the same shape, timed in the same process.
// Reported: the best time, the weight's bytes read per second (the weight as
// stored: f32, bf16 or its blocks) and the median of paired ratios to dense
// f32 (time_pair).
//
// Decode reads each weight once per token, so its speed is the memory
// bandwidth the kernel reaches; a [2048 x 2048] Q4_0 weight (2.25 MiB) sits in
// a large L3 when called again and again, which a model of 1B parameters
// never does. `cold` runs cycle through copies of the weight totalling
// --cold-mib (default 256 MiB, beyond any L3 here), as a model's layers
// would; `hot` runs reuse one weight. The `stream` line is a plain AVX2 read
// of the same bytes on the same threads: the bandwidth ceiling.
//
//   bench_quant [--reps 5] [--cold-mib 256] [--shapes 2048x2048,8192x2048]
//               [--sweep] [--sweep-max 32]
//
// (threads from OMP_NUM_THREADS). --sweep instead times the two paths of
// the product apart (direct kernel, dequantised panels + oneDNN) for N = 1 ..
// --sweep-max on each shape, to place the threshold between them.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "ops/cpu/quant_blocks.h"
#include "ops/cpu_quant_paths.h"
#include "ops/ops.h"
#include "ops/quant.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

using nk::DType;
using nk::Tensor;
namespace ops = nk::ops;
using ops::QuantType;

constexpr QuantType kTypes[] = {QuantType::Q8_0,  QuantType::Q4_0, QuantType::Q4_K, QuantType::Q6_K,
                                QuantType::W8A16, QuantType::W8A8, QuantType::F16};

Tensor random_tensor(const nk::Shape& shape, DType t, uint64_t seed, double std) {
  Tensor f = Tensor::empty(shape, DType::F32);
  nk::Rng r(seed);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = float(r.normal() * std);
  if (t == DType::F32) return f;
  Tensor out = Tensor::empty(shape, t);
  ops::convert(out, f);
  return out;
}

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A timed sample: `calls` calls of fn, seconds per call.
double sample(const std::function<void()>& fn, int calls) {
  return seconds([&] {
           for (int i = 0; i < calls; ++i) fn();
         }) /
         calls;
}

// Calls per sample so that one sample lasts ~5 ms (timer noise, thread wake-up).
int calls_for(const std::function<void()>& fn) {
  const double t = std::max(1e-7, sample(fn, 1));
  return std::max(1, int(0.005 / t));
}

// The dense op and its quantised twin timed in turns, so that both see the
// same load on a shared machine: the best time of each, and the median of the
// per-turn ratios quant / dense. At least `reps` turns and 1 s, after a
// warm-up (oneDNN primitives, scratch buffers).
struct Pair {
  double dense, quant, ratio;
};
Pair time_pair(int reps, const std::function<void()>& dense, const std::function<void()>& quant) {
  const int cd = calls_for(dense), cq = calls_for(quant);
  std::vector<double> ratios;
  Pair p{1e30, 1e30, 0};
  for (double total = 0; int(ratios.size()) < reps || total < 1.0;) {
    const double d = sample(dense, cd), q = sample(quant, cq);
    p.dense = std::min(p.dense, d);
    p.quant = std::min(p.quant, q);
    ratios.push_back(q / d);
    total += d * cd + q * cq;
  }
  std::sort(ratios.begin(), ratios.end());
  p.ratio = ratios[ratios.size() / 2];
  return p;
}

double best_of(int reps, const std::function<void()>& fn) {
  const int calls = calls_for(fn);
  double best = 1e30;
  for (double total = 0; reps-- > 0 || total < 0.5;) {
    const double t = sample(fn, calls);
    best = std::min(best, t);
    total += t * calls;
  }
  return best;
}

// Copies of one weight that together hold at least `mib` MiB (1 copy: hot).
template <typename W>
struct Copies {
  std::vector<W> w;
  size_t next = 0;
  const W& take() { return w[next++ % w.size()]; }
};

size_t copies_for(size_t bytes, size_t mib) {
  return mib == 0 ? 1 : std::max<size_t>(1, ((mib << 20) + bytes - 1) / bytes);
}

Copies<Tensor> dense_copies(const Tensor& w, size_t mib) {
  Copies<Tensor> c;
  for (size_t i = 0; i < copies_for(w.nbytes(), mib); ++i) {
    Tensor t = Tensor::empty(w.shape(), w.dtype());
    std::memcpy(t.raw(), w.raw(), w.nbytes());
    c.w.push_back(t);
  }
  return c;
}

Copies<ops::QuantWeight> quant_copies(const ops::QuantWeight& q, size_t mib) {
  Copies<ops::QuantWeight> c;
  for (size_t i = 0; i < copies_for(q.nbytes(), mib); ++i) {
    ops::QuantWeight k = ops::QuantWeight::empty(q.type, q.shape);
    std::memcpy(k.data.raw(), q.data.raw(), q.data.nbytes());
    if (q.scale.defined()) std::memcpy(k.scale.raw(), q.scale.raw(), q.scale.nbytes());
    c.w.push_back(k);
  }
  return c;
}

// GB/s of a plain read of `mib` MiB split over the threads (AVX2 loads).
double stream_read_gbs(size_t mib, int reps) {
  const int64_t n = int64_t(mib << 20) / 64;
  Tensor buf = Tensor::empty({n * 64}, DType::U8);
  std::memset(buf.raw(), 1, size_t(n * 64));
  const uint8_t* p = buf.data<uint8_t>();
  std::vector<int64_t> sink(64, 0);
  const double t = best_of(reps, [&] {
    nk::parallel_for(n, 4096, [&](int64_t b, int64_t e) {
      int64_t s = 0;
#if defined(__AVX2__)
      __m256i a0 = _mm256_setzero_si256(), a1 = a0;
      for (int64_t i = b; i < e; ++i) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 64 * i)));
        a1 = _mm256_add_epi64(a1,
                              _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 64 * i + 32)));
      }
      s = _mm256_extract_epi64(_mm256_add_epi64(a0, a1), 0);
#else
      for (int64_t i = b; i < e; ++i) s += p[64 * i];
#endif
      sink[size_t(b * 63 / n)] += s;
    });
  });
  return double(n * 64) / t * 1e-9;
}

struct Shape2 {
  int64_t out, in;
};

std::vector<Shape2> parse_shapes(const std::string& s) {
  std::vector<Shape2> out;
  size_t at = 0;
  while (at < s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    const std::string one = s.substr(at, comma - at);
    const size_t x = one.find('x');
    out.push_back({std::atoll(one.substr(0, x).c_str()), std::atoll(one.substr(x + 1).c_str())});
    at = comma + 1;
  }
  return out;
}

void print_row(const std::string& name, const std::string& mode, double bytes, const Pair& p,
               bool is_dense_f32) {
  const double t = is_dense_f32 ? p.dense : p.quant;
  fmt::print("  {:6} {:5} {:10.3f} {:9.2f} {:8.1f} {:9.2f}\n", name, mode, t * 1e3,
             bytes / double(1 << 20), bytes / t * 1e-9, is_dense_f32 ? 1.0 : p.ratio);
}

// One shape: N = 1 (hot and cold) and N = 128 (hot), every weight kind.
void run_shape(Shape2 s, int reps, size_t cold_mib) {
  const Tensor w32 = random_tensor({s.out, s.in}, DType::F32, 1, 0.02);
  Tensor w16 = Tensor::empty({s.out, s.in}, DType::BF16);
  ops::convert(w16, w32);
  std::vector<ops::QuantWeight> qs, packed;
  for (QuantType t : kTypes) {
    qs.push_back(ops::QuantWeight::empty(t, {s.out, s.in}));
    ops::quant_quantize(qs.back(), w32);
    packed.push_back(ops::QuantWeight::empty(t, {s.out, s.in}));
    ops::quant_quantize(packed.back(), w32);
    if (!ops::quant_pack(packed.back())) packed.back() = ops::QuantWeight();
  }
  for (int64_t n : {int64_t(1), int64_t(128)}) {
    for (size_t mib : n == 1 ? std::vector<size_t>{0, cold_mib} : std::vector<size_t>{0}) {
      const std::string mode = mib ? "cold" : "hot";
      fmt::print("[{} x {}] N={} {} (threads {}){}\n", s.out, s.in, n, mode, nk::num_threads(),
                 mib ? fmt::format(", weights cycled over {} MiB", mib) : "");
      fmt::print("  {:6} {:5} {:>10} {:>9} {:>8} {:>9}\n", "weight", "mode", "ms", "MiB", "GB/s",
                 "vs f32");
      const Tensor x32 = random_tensor({n, s.in}, DType::F32, 2, 1.0);
      Tensor x16 = Tensor::empty({n, s.in}, DType::BF16);
      ops::convert(x16, x32);
      Tensor y32 = Tensor::empty({n, s.out}, DType::F32),
             y16 = Tensor::empty({n, s.out}, DType::BF16);
      Copies<Tensor> d32 = dense_copies(w32, mib);
      auto dense = [&] { ops::linear_forward(y32, x32, d32.take(), Tensor()); };
      {
        Copies<Tensor> d16 = dense_copies(w16, mib);
        const Pair p16 =
            time_pair(reps, dense, [&] { ops::linear_forward(y16, x16, d16.take(), Tensor()); });
        print_row("f32", mode, double(w32.nbytes()), p16, true);
        print_row("bf16", mode, double(w16.nbytes()), p16, false);
      }
      for (const ops::QuantWeight& q : qs) {
        Copies<ops::QuantWeight> c = quant_copies(q, mib);
        const Pair p = time_pair(reps, dense,
                                 [&] { ops::quant_linear_forward(y32, x32, c.take(), Tensor()); });
        print_row(ops::quant_type_name(q.type), mode, double(q.nbytes()), p, false);
      }
      if (mib)
        fmt::print("  stream read of {} MiB: {:.1f} GB/s\n", mib, stream_read_gbs(mib, reps));
    }
  }
}

// Both paths of the product timed apart for N = 1 .. max (hot weights).
void sweep(Shape2 s, int reps, int64_t max_n) {
  const Tensor w32 = random_tensor({s.out, s.in}, DType::F32, 1, 0.02);
  fmt::print(
      "[{} x {}] threads {}: ms of the direct kernel / dequantised panels + oneDNN / VNNI tiles / "
      "VNNI tiles on the packed weight\n",
      s.out, s.in, nk::num_threads());
  fmt::print("{:>4}", "N");
  for (QuantType t : kTypes) fmt::print(" {:>27}", ops::quant_type_name(t));
  fmt::print("\n");
  std::vector<ops::QuantWeight> qs, packed;
  for (QuantType t : kTypes) {
    qs.push_back(ops::QuantWeight::empty(t, {s.out, s.in}));
    ops::quant_quantize(qs.back(), w32);
    packed.push_back(ops::QuantWeight::empty(t, {s.out, s.in}));
    ops::quant_quantize(packed.back(), w32);
    if (!ops::quant_pack(packed.back())) packed.back() = ops::QuantWeight();
  }
  for (int64_t n = 1; n <= max_n; n += n < 8 ? 1 : n < 16 ? 2 : 4) {
    const Tensor x = random_tensor({n, s.in}, DType::F32, 2, 1.0);
    Tensor y = Tensor::empty({n, s.out}, DType::F32);
    fmt::print("{:4}", n);
    for (size_t i = 0; i < qs.size(); ++i) {
      const ops::QuantWeight& q = qs[i];
      const double direct =
          best_of(reps, [&] { ops::cpu_quant_paths().direct(y, x, q, Tensor()); });
      const double panels =
          best_of(reps, [&] { ops::cpu_quant_paths().panels(y, x, q, Tensor()); });
      if (ops::cpu_quant_paths().gemm_available(q.type, s.in)) {
        const double gemm = best_of(reps, [&] { ops::cpu_quant_paths().gemm(y, x, q, Tensor()); });
        const double pk = !packed[i].defined() ? 0 : best_of(reps, [&] {
          ops::cpu_quant_paths().gemm(y, x, packed[i], Tensor());
        });
        fmt::print(" {:6.3f}/{:6.3f}/{:6.3f}/{:6.3f}", direct * 1e3, panels * 1e3, gemm * 1e3,
                   pk * 1e3);
      } else {
        fmt::print(" {:6.3f}/{:6.3f}/{:>6}/{:>6}", direct * 1e3, panels * 1e3, "-", "-");
      }
    }
    fmt::print("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  size_t cold_mib = 256;
  int64_t sweep_max = 32;
  bool do_sweep = false;
  std::string shapes = "2048x2048,8192x2048";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--sweep") {
      do_sweep = true;
      continue;
    }
    if (a == "--reps") reps = std::atoi(v);
    if (a == "--cold-mib") cold_mib = size_t(std::atoll(v));
    if (a == "--shapes") shapes = v;
    if (a == "--sweep-max") sweep_max = std::atoll(v);
    ++i;
  }
  for (Shape2 s : parse_shapes(shapes)) {
    if (do_sweep)
      sweep(s, reps, sweep_max);
    else
      run_shape(s, reps, cold_mib);
  }
  return 0;
}
