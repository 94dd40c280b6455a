#include "train/step_calibration.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/error.h"
#include "nn/context_parallel.h"
#include "parallel/pipeline_parallel.h"

namespace nk {

double StepCalibration::oversubscription() const {
  const double by_cores =
      std::max(1.0, double(procs_per_node * threads) / double(std::max<int64_t>(1, cores)));
  if (sharing <= 0) return by_cores;
  // Ranks of one thread each, all computing, cannot run faster than the
  // cores they share allow: a measured sharing under that (the probe's
  // copies start apart and overlap less than a run's ranks do: x1.98 for 4
  // ranks on 2 cores, 2026-12-02) is the probe's noise. A rank of several
  // threads may use them less than fully alone, so its sharing can be less.
  return std::max(threads == 1 ? by_cores : 1.0, sharing);
}

namespace {

// A cost measured in a sharding group of `size` (`group`) and of 2
// (`pair`, negative: not measured), at a group of `ranks`: on the line
// through both; at least 0.
double by_group(double group, double pair, int64_t size, int64_t ranks) {
  if (pair < 0 || size <= 2) return group;
  return std::max(0.0, pair + (group - pair) * double(ranks - 2) / double(size - 2));
}

}  // namespace

double StepCalibration::fsdp_step_in(int64_t ranks) const {
  return by_group(fsdp_step_s, fsdp_pair_step_s, fsdp_group, ranks);
}

double StepCalibration::zero2_in(int64_t ranks) const {
  if (zero2_group <= 1 || ranks <= 1) return 0;
  if (zero2_pair_micro_batch_s >= 0 && zero2_group > 2)
    return by_group(zero2_micro_batch_s, zero2_pair_micro_batch_s, zero2_group, ranks);
  auto share = [](int64_t n) { return double(n - 1) / double(n); };
  return zero2_micro_batch_s * share(ranks) / share(zero2_group);
}

double StepCalibration::refault_in(int64_t ranks) const {
  return by_group(refault_s_per_byte, fsdp_pair_refault_s_per_byte, fsdp_group, ranks);
}

nlohmann::json StepCalibration::to_json() const {
  return {{"cores", cores},
          {"procs_per_node", procs_per_node},
          {"threads", threads},
          {"sharing", sharing},
          {"oversubscription", oversubscription()},
          {"compute_scale", compute_scale},
          {"per_micro_batch_s", per_micro_batch_s},
          {"per_step_s", per_step_s},
          {"probe_recompute", probe_recompute},
          {"ring_attention_scale", ring_attention_scale},
          {"ring_message_s", ring_message_s},
          {"message_wait_share", message_wait_share},
          {"refault_s_per_byte", refault_s_per_byte},
          {"page_refault_s_per_byte", page_refault_s_per_byte},
          {"fsdp_step_s", fsdp_step_s},
          {"fsdp_group", fsdp_group},
          {"fsdp_pair_step_s", fsdp_pair_step_s},
          {"fsdp_pair_refault_s_per_byte", fsdp_pair_refault_s_per_byte},
          {"zero2_micro_batch_s", zero2_micro_batch_s},
          {"zero2_group", zero2_group},
          {"zero2_pair_micro_batch_s", zero2_pair_micro_batch_s},
          {"link_bytes_per_s", link_bytes_per_s},
          {"link_latency_s", link_latency_s}};
}

StepCalibration StepCalibration::from_json(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object()) fail("{}: the calibration is not an object", what);
  StepCalibration c;
  auto read = [&](const char* key, auto& v) {
    if (!j.contains(key)) return;
    const nlohmann::json& x = j.at(key);
    if (!x.is_number()) fail("{}: calibration key '{}' is not a number ({})", what, key, x.dump());
    v = x.get<std::remove_reference_t<decltype(v)>>();
  };
  read("cores", c.cores);
  read("procs_per_node", c.procs_per_node);
  read("threads", c.threads);
  read("sharing", c.sharing);
  read("compute_scale", c.compute_scale);
  read("per_micro_batch_s", c.per_micro_batch_s);
  read("per_step_s", c.per_step_s);
  read("probe_recompute", c.probe_recompute);
  read("ring_attention_scale", c.ring_attention_scale);
  read("ring_message_s", c.ring_message_s);
  read("message_wait_share", c.message_wait_share);
  read("refault_s_per_byte", c.refault_s_per_byte);
  read("page_refault_s_per_byte", c.page_refault_s_per_byte);
  read("fsdp_step_s", c.fsdp_step_s);
  read("fsdp_group", c.fsdp_group);
  read("fsdp_pair_step_s", c.fsdp_pair_step_s);
  read("fsdp_pair_refault_s_per_byte", c.fsdp_pair_refault_s_per_byte);
  read("zero2_micro_batch_s", c.zero2_micro_batch_s);
  read("zero2_group", c.zero2_group);
  read("zero2_pair_micro_batch_s", c.zero2_pair_micro_batch_s);
  read("link_bytes_per_s", c.link_bytes_per_s);
  read("link_latency_s", c.link_latency_s);
  if (c.cores < 1 || c.procs_per_node < 1 || c.threads < 1)
    fail("{}: calibration cores {}, procs_per_node {}, threads {}: each must be at least 1", what,
         c.cores, c.procs_per_node, c.threads);
  if (!(c.compute_scale > 0) || !(c.link_bytes_per_s > 0))
    fail("{}: calibration compute_scale {} and link_bytes_per_s {} must be positive", what,
         c.compute_scale, c.link_bytes_per_s);
  return c;
}

namespace {

// A dependent chain of multiply-adds: compute-bound on one core, no memory
// traffic, so its wall time is the share of a core its thread gets.
double spin(int64_t iters) {
  double x = 1.0, y = 0.999999;
  for (int64_t i = 0; i < iters; ++i) x = x * y + 1e-9;
  return x;
}

double wall_of(int64_t threads, int64_t iters) {
  std::vector<std::thread> pool;
  std::atomic<double> sink{0};
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back([&] { sink = sink + spin(iters); });
  for (std::thread& t : pool) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double measure_core_sharing(int64_t threads, int64_t total) {
  if (total <= threads) return 1.0;
  // About 40 ms per loop on a free core.
  int64_t iters = 1 << 20;
  while (wall_of(1, iters) < 0.04 && iters < (int64_t(1) << 34)) iters *= 2;
  double solo = 1e30, all = 1e30;
  for (int round = 0; round < 3; ++round) {
    solo = std::min(solo, wall_of(threads, iters));
    all = std::min(all, wall_of(total, iters));
  }
  return all / solo;
}

PageRefault measure_page_refault(int64_t bytes, int64_t rounds) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  if (bytes < page || bytes > (int64_t(1) << 34))
    fail("measure_page_refault: {} bytes is not between a page ({} bytes) and 16 GiB", bytes, page);
  if (rounds < 1 || rounds > 1000)
    fail("measure_page_refault: {} rounds is not between 1 and 1000", rounds);
  PageRefault r;
  const size_t n = size_t(bytes);
  void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return r;
#ifdef MADV_HUGEPAGE
  // In huge pages where the kernel gives them, as the released arenas it
  // stands for (parallel/sharded_weights.h: advise_huge_pages).
  (void)madvise(m, n, MADV_HUGEPAGE);
#endif
  r.bytes = bytes, r.rounds = rounds;
  char* p = static_cast<char*>(m);
  std::memset(p, 1, n);
  auto faults = [] {  // this thread's minor page faults so far
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    return int64_t(u.ru_minflt);
  };
  using Clock = std::chrono::steady_clock;
  double plain = 1e30, refault = 1e30;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t f0 = faults();
    const auto t0 = Clock::now();
    std::memset(p, int(round), n);
    const auto t1 = Clock::now();
    const int64_t f1 = faults();
    madvise(p, n, MADV_DONTNEED);
    const int64_t f2 = faults();
    std::memset(p, int(round) + 1, n);
    const auto t2 = Clock::now();  // (the release's own cost counts, as FSDP pays it)
    r.resident_faults += f1 - f0;
    r.refaults += faults() - f2;
    plain = std::min(plain, std::chrono::duration<double>(t1 - t0).count());
    refault = std::min(refault, std::chrono::duration<double>(t2 - t1).count());
  }
  munmap(m, n);
  r.s_per_byte = std::max(0.0, (refault - plain) / double(n));
  return r;
}

void fit_compute(StepCalibration& cal, double n1, double c1, double m1, double n2, double c2,
                 double m2) {
  // m_i = a c_i + n_i o: Cramer's rule (the determinant is c1 n2 - c2 n1,
  // about c (n2 - n1) since both runs compute the same tokens).
  const double det = c1 * n2 - c2 * n1;
  double a = det != 0 ? (m1 * n2 - m2 * n1) / det : m1 / c1;
  double o = det != 0 ? (c1 * m2 - c2 * m1) / det : 0;
  if (o < 0) o = 0, a = (m1 + m2) / (c1 + c2);
  if (a < 0.25) {  // noise made the overhead eat the compute: keep the overhead's share
    a = 0.25;
    o = std::max(0.0, ((m1 - a * c1) + (m2 - a * c2)) / (n1 + n2));
  }
  cal.compute_scale = a;
  cal.per_micro_batch_s = o;
}

bool fit_step(StepCalibration& cal, const double n[3], const double c[3], const double m[3]) {
  // m_i = a c_i + o n_i + f: Gaussian elimination on the 3 x 3 system.
  double A[3][4];
  for (int i = 0; i < 3; ++i) A[i][0] = c[i], A[i][1] = n[i], A[i][2] = 1, A[i][3] = m[i];
  bool ok = true;
  for (int col = 0; col < 3 && ok; ++col) {
    int piv = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::abs(A[r][col]) > std::abs(A[piv][col])) piv = r;
    if (std::abs(A[piv][col]) < 1e-15) {
      ok = false;
      break;
    }
    for (int k = 0; k < 4; ++k) std::swap(A[col][k], A[piv][k]);
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      const double q = A[r][col] / A[col][col];
      for (int k = col; k < 4; ++k) A[r][k] -= q * A[col][k];
    }
  }
  const double a = ok ? A[0][3] / A[0][0] : 0, o = ok ? A[1][3] / A[1][1] : 0,
               f = ok ? A[2][3] / A[2][2] : 0;
  if (!ok || a < 0.25 || o < 0 || f < 0) {
    fit_compute(cal, n[0], c[0], m[0], n[1], c[1], m[1]);
    cal.per_step_s = 0;
    return false;
  }
  cal.compute_scale = a;
  cal.per_micro_batch_s = o;
  cal.per_step_s = f;
  return true;
}

bool fit_ring(StepCalibration& cal, const RingProbe& few, const RingProbe* many) {
  cal.ring_message_s = -1;
  if (many && many->ring_messages > few.ring_messages) {
    // (s - 1) A_i + M_i x = r_i: Cramer's rule.
    const double det =
        few.per_scale_s * many->ring_messages - many->per_scale_s * few.ring_messages;
    if (det != 0) {
      const double s1 = (few.extra_s * many->ring_messages - many->extra_s * few.ring_messages) /
                        det,
                   x = (few.per_scale_s * many->extra_s - many->per_scale_s * few.extra_s) / det;
      if (x >= 0 && 1.0 + s1 >= 0.5 && 1.0 + s1 <= 10.0) {
        cal.ring_attention_scale = 1.0 + s1;
        cal.ring_message_s = x;
        return true;
      }
    }
  }
  // The scale alone, the messages at the link's latency: least squares over
  // the probes there are (two halve one run's noise, which the scale, a
  // small share of the step, amplifies).
  double num = 0, den = 0;
  for (const RingProbe* r : {&few, many})
    if (r && r->per_scale_s > 0) {
      num += r->per_scale_s * (r->extra_s - r->ring_messages * cal.link_latency_s);
      den += r->per_scale_s * r->per_scale_s;
    }
  cal.ring_attention_scale = den > 0 ? std::clamp(1.0 + num / den, 0.5, 10.0) : 1.0;
  return false;
}

bool fit_fsdp(StepCalibration& cal, const std::vector<FsdpProbeFit>& probes, double page) {
  if (probes.size() < 2) return false;
  // The normal equations of extra = r x per_byte + s x per_step.
  double bb = 0, bs = 0, ss = 0, be = 0, se = 0;
  for (const FsdpProbeFit& p : probes) {
    bb += p.per_byte * p.per_byte, bs += p.per_byte * p.per_step, ss += p.per_step * p.per_step;
    be += p.per_byte * p.extra_s, se += p.per_step * p.extra_s;
  }
  const double det = bb * ss - bs * bs;
  if (!(std::abs(det) > 1e-12 * bb * ss)) return false;  // slopes in proportion
  const double r = (be * ss - se * bs) / det, s = (bb * se - bs * be) / det;
  if (!(r > 0 && r >= page && s >= 0)) return false;
  cal.refault_s_per_byte = r, cal.fsdp_step_s = s;
  return true;
}

bool fit_fsdp_per_byte(StepCalibration& cal, const std::vector<FsdpProbeFit>& probes, double page) {
  double num = 0, den = 0;
  for (const FsdpProbeFit& p : probes)
    num += p.per_byte * p.extra_s, den += p.per_byte * p.per_byte;
  const double r = den > 0 ? num / den : 0;
  if (!(r > 0 && r >= page)) return false;
  cal.refault_s_per_byte = r, cal.fsdp_step_s = 0;
  return true;
}

void fit_fsdp_at_page(StepCalibration& cal, const std::vector<FsdpProbeFit>& probes, double page) {
  double least = 1e30;
  for (const FsdpProbeFit& p : probes)
    if (p.per_step > 0) least = std::min(least, (p.extra_s - page * p.per_byte) / p.per_step);
  cal.refault_s_per_byte = page;
  cal.fsdp_step_s = least < 1e30 ? std::max(0.0, least) : 0.0;
}

std::pair<int64_t, int64_t> busiest_stage(const TrainConfig& c, int64_t pp) {
  const std::vector<Recompute> plan =
      recompute_plan(c.recompute, c.recompute_layers, c.model.n_layer);
  std::pair<int64_t, int64_t> best{0, 0};
  for (int64_t s = 0; s < pp; ++s) {
    const PipelineStage st =
        pp > 1 ? parallel::pipeline_stage(c.model, pp, s, c.parallel.pp_layout, c.parallel.vp)
               : PipelineStage{};
    int64_t n = 0, f = 0;
    for (int64_t l = 0; l < c.model.n_layer; ++l)
      if (st.holds_layer(c.model, l)) {
        ++n;
        f += plan[size_t(l)] == Recompute::Full ? 1 : 0;
      }
    if (n > best.first) best = {n, f};
  }
  return best;
}

double pipeline_oversubscription(double oversub, int64_t m, int64_t pp, int64_t vp) {
  const int64_t chunks = std::max<int64_t>(1, m) * std::max<int64_t>(1, vp);
  pp = std::max<int64_t>(1, pp);
  const int64_t slots = chunks + pp - 1;
  double sum = 0;
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t k = std::min({s + 1, pp, chunks, slots - s});
    sum += std::max(1.0, oversub * double(k) / double(pp));
  }
  return sum / double(slots);
}

double recompute_overhead(const TrainConfig& c) {
  const std::vector<Recompute> plan =
      recompute_plan(c.recompute, c.recompute_layers, c.model.n_layer);
  const double full = double(std::count(plan.begin(), plan.end(), Recompute::Full));
  return 1.0 + full / (3.0 * double(std::max<int64_t>(1, c.model.n_layer)));
}

StepPrediction predict_step(const TrainConfig& c, const TrainEstimate& e,
                            const StepCalibration& cal) {
  StepPrediction p;
  const int64_t cp = std::max<int64_t>(1, c.parallel.mesh.cp),
                vp = std::max<int64_t>(1, c.parallel.vp);
  const double m = double(c.grad_accum() / e.dp);  // this rank's micro-batches
  // 1F1B over pp stages of vp chunks each: the fill and drain take (pp - 1)
  // chunk-steps of 1/vp of a stage's work (estimate_training composes the
  // stages' compute so).
  const double mbs = m + double(e.pp - 1) / double(vp);
  const auto [layers, full] = busiest_stage(c, e.pp);
  // Cores are shared only while the peers compute: in the pipeline's fill
  // and drain the idle stages leave them to the busy ones. (So is the share
  // other work leaves: Linux's scheduler shares the cores between sessions
  // (autogroups) first, and a stage that waits leaves its session's share
  // to the one that computes.)
  const double over = pipeline_oversubscription(cal.oversubscription(), int64_t(m), e.pp, vp);
  // Context parallel: estimate_training counts each rank's T / cp tokens and
  // its ring blocks' tiles; the ring's blocks (their own online softmax
  // merged into the running output, the exchanges' waits) cost
  // ring_attention_scale times the causal kernel's tiles, as measured.
  const bool ring =
      cp > 1 && nn::parse_cp_comm(c.parallel.cp_comm_type) != nn::CpComm::A2A;  // the block kernel
  p.compute_s =
      over * cal.compute_scale *
      (e.step.total() + (ring ? cal.ring_attention_scale - 1.0 : 0.0) * e.step.attention_s);
  // What a micro-batch costs beside its arithmetic goes with the weights
  // the rank holds (each micro-batch's weight gradients written and
  // accumulated, every op's pass over its weights): the busiest stage's
  // share of the model's parameters, its tensor-parallel shards (4 ranks of
  // the 2-core VM, gpt-tiny: 7 more micro-batches a step added 8 ms at tp 4,
  // 28-35 at tp 2 x cp 2, 46 at cp 4, where the whole model's cost had
  // charged 44-59 ms at tp 4 and 40-58 at tp 2 x cp 2).
  double held = 0;
  for (const RankEstimate& r : e.stages) held = std::max(held, double(r.params));
  const double held_share = held / double(std::max<int64_t>(1, e.params));
  p.overhead_s = over * (cal.per_micro_batch_s * mbs * held_share * recompute_overhead(c) /
                             cal.probe_recompute +
                         cal.per_step_s);

  // Communication, per rank and step (ring collectives, no overlap assumed).
  // Bytes on the wire: a reduction's in f32 whatever the compute dtype (the
  // MPI path stages bf16 and f16 through f32 for its sum:
  // dist/mpi/buffers.cc), a gather's or a send's in its own dtype.
  const double s = double(dtype_size(c.dtype)), f32 = 4.0;
  const double B = double(c.micro_batch), T = double(c.seq_len) / double(cp);
  const double act = B * T * double(c.model.d_model);  // elements
  // Gradients: all-reduced over the dp x cp ranks that hold the same
  // weights, in buckets of parallel.bucket_mb (ZeRO-1: a reduce-scatter and
  // an all-gather per bucket; ZeRO-2 reduce-scatters every micro-batch's).
  // FSDP reduce-scatters them (every micro-batch's without a pipeline) and
  // all-gathers the compute weights of every bucket before each
  // micro-batch's forward and again before its backward
  // (parallel/sharded_weights.h).
  const int64_t red = e.dp * cp;
  if (red > 1) {
    double grads = 0, params = 0;
    for (const RankEstimate& r : e.stages) {
      grads = std::max(grads, double(r.params) * f32);
      params = std::max(params, double(r.params));
    }
    const double share = double(red - 1) / double(red);
    const double buckets =
        std::max(1.0, std::ceil(grads / std::max(1.0, c.ddp.bucket_mb * 1048576.0)));
    switch (c.ddp.shard) {
      case parallel::Shard::None:
        p.comm_bytes += 2.0 * share * grads, p.messages += buckets;
        break;
      case parallel::Shard::Optimizer:
        p.comm_bytes += 2.0 * share * grads, p.messages += 2.0 * buckets;
        break;
      case parallel::Shard::Gradients:
        p.comm_bytes += share * (m + 1.0) * grads, p.messages += (m + 1.0) * buckets;
        // Each micro-batch's reduction past its bytes (calibrate_zero2's
        // probes, by the sharding group's size), less what recomputed
        // forwards hide: a wait for the group, it passes while the next
        // stage's forward is computed again (dp 4 on the 2-core VM, gpt-tiny,
        // one sequence per micro-batch: ZeRO-2's step past ZeRO-1's 57.5 ms
        // without recompute, 26.8 with full recompute, which added 39.3).
        {
          const double again = e.recompute_flops > 0 ? p.compute_s * e.recompute_flops /
                                                           (e.flops_per_step + e.recompute_flops)
                                                     : 0.0;
          p.overhead_s += std::max(0.0, over * m * cal.zero2_in(red) - again);
        }
        break;
      case parallel::Shard::Full: {
        const double reductions = e.pp == 1 ? m : 1.0;
        p.comm_bytes += share * (reductions * grads + 2.0 * m * params * s);
        p.messages += buckets * (reductions + 2.0 * m);
        // The other ranks' blocks were handed back after their last use:
        // each gather faults their pages in again (per byte), and a step
        // costs fsdp_step_s beside, by the size of the sharding group
        // (both measured by autoconfig's fully sharded probes).
        p.overhead_s +=
            over * (2.0 * m * share * params * s * cal.refault_in(red) + cal.fsdp_step_in(red));
        break;
      }
    }
  }
  // Tensor parallel: 4 points per layer and micro-batch (attention and MLP,
  // forward and backward), 2 more for a fully recomputed layer; at each an
  // all-reduce of the activations, or under sequence parallelism an
  // all-gather and a reduce-scatter (half the all-reduce's bytes each); and
  // the vocabulary-parallel loss's 3 small ones.
  if (e.tp > 1) {
    const double points = double(4 * layers + 2 * full), share = double(e.tp - 1) / double(e.tp);
    if (c.parallel.sequence_parallel) {
      p.comm_bytes += m * points * share * act * (s + f32);
      p.messages += m * (2.0 * points + 3.0);
    } else {
      p.comm_bytes += m * points * 2.0 * share * act * f32;
      p.messages += m * (points + 3.0);
    }
  }
  // Pipeline: each micro-batch's activation sent on and its gradient sent
  // back at every one of the rank's vp chunk boundaries.
  if (e.pp > 1) {
    p.comm_bytes += m * double(vp) * 2.0 * act * s / (c.parallel.sequence_parallel ? e.tp : 1);
    p.messages += m * double(vp) * 2.0;
  }
  // Context parallel: the attention's exchanges (nn::cp_exchange_bytes,
  // counted by estimate_training); messages per layer: the ring passes keys
  // and values on cp - 1 times forward and again backward, and their f32
  // gradients cp times (p2p); one gather forward, a gather and a
  // reduce-scatter backward (all_gather); two all-to-alls each way (a2a);
  // a2a+p2p both over their groups. A fully recomputed layer's forward once
  // more.
  if (cp > 1) {
    const auto comm = nn::parse_cp_comm(c.parallel.cp_comm_type);
    const double a = c.parallel.hierarchical_cp_sizes.empty()
                         ? 1.0
                         : double(c.parallel.hierarchical_cp_sizes[0]),
                 ringn = comm == nn::CpComm::A2AP2P ? double(cp) / a : double(cp);
    auto per_layer = [&](bool forward) {
      switch (comm) {
        case nn::CpComm::P2P:
          return forward ? ringn - 1 : 2 * ringn - 1;
        case nn::CpComm::AllGather:
          return forward ? 1.0 : 2.0;
        case nn::CpComm::A2A:
          return 2.0;
        case nn::CpComm::A2AP2P:
          return 2.0 + (forward ? ringn - 1 : 2 * ringn - 1);
      }
      return 0.0;
    };
    p.comm_bytes += double(e.cp_bytes_per_step);
    p.messages += m * (double(layers + full) * per_layer(true) + double(layers) * per_layer(false));
    if (comm == nn::CpComm::P2P || comm == nn::CpComm::A2AP2P)
      p.ring_messages =
          m * (double(layers + full) * (ringn - 1) + double(layers) * (2 * ringn - 1));
  }
  p.comm_bytes += double(e.a2a_bytes_per_step);
  const double ring_message_s = cal.ring_message_s >= 0 ? cal.ring_message_s : cal.link_latency_s;
  double wait =
      (p.messages - p.ring_messages) * cal.link_latency_s + p.ring_messages * ring_message_s;
  if (cal.message_wait_share > 0)
    wait = std::min(wait, cal.message_wait_share * (p.compute_s + p.overhead_s));
  p.comm_s = p.comm_bytes / cal.link_bytes_per_s + wait;
  return p;
}

}  // namespace nk
