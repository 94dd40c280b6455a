#include "parallel/sharded_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "ops/ops.h"

namespace nk::parallel {

namespace {
size_t page_size() {
  static const size_t p = size_t(::sysconf(_SC_PAGESIZE));
  return p;
}
}  // namespace

size_t resident_bytes(const Tensor& t) {
  if (!t.defined() || t.nbytes() == 0) return 0;
  if (!t.on_host()) return t.nbytes();  // device memory is never paged out
  const size_t page = page_size();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.raw()) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(t.raw()) + t.nbytes();
  const size_t pages = (end - begin + page - 1) / page;
  std::vector<unsigned char> in(pages);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, in.data()) != 0)
    fail("mincore over {}: {}", t.desc(), std::strerror(errno));
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return std::min(n * page, t.nbytes());
}

void advise_huge_pages(const Tensor& arena) {
#ifdef MADV_HUGEPAGE
  if (!arena.defined() || !arena.on_host() || arena.nbytes() == 0) return;
  const size_t page = page_size();
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(arena.raw()) + page - 1) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(arena.raw()) + arena.nbytes()) / page * page;
  // Advice: a kernel without THP answers EINVAL, and small pages serve.
  if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)arena;
#endif
}

namespace {
// Calls f(first byte, one past the last byte, element offset, elements) for
// each other rank's block of bucket `b` of `arena`.
template <class F>
void for_other_blocks(const Tensor& arena, const GradBucket& b, const dist::Communicator& comm,
                      F f) {
  const auto counts = shard_counts(b, comm.size());
  const size_t es = dtype_size(arena.dtype());
  char* base = static_cast<char*>(arena.raw());
  int64_t at = b.begin;
  for (int j = 0; j < comm.size(); ++j) {
    const int64_t n = counts[size_t(j)];
    if (j != comm.rank() && n > 0) f(base + at * es, base + (at + n) * es, at, n);
    at += n;
  }
}

// Hands the whole pages inside [lo, hi) back to the OS; returns the range
// they cover (empty if none).
std::pair<char*, char*> drop_pages(char* lo, char* hi, const dist::Communicator& comm,
                                   const char* what) {
  const size_t page = page_size();
  char* a = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(lo) + page - 1) / page * page);
  char* z = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(hi) / page * page);
  if (z <= a) return {lo, lo};
  if (::madvise(a, size_t(z - a), MADV_DONTNEED) != 0)
    fail("{}: releasing {}: madvise: {}", comm.where("fsdp", 0), what, std::strerror(errno));
  return {a, z};
}
}  // namespace

void release_other_blocks(const Tensor& arena, const GradBucket& b,
                          const dist::Communicator& comm) {
  // Only whole pages inside the block: a page shared with an owned block keeps its bytes.
  for_other_blocks(arena, b, comm, [&](char* lo, char* hi, int64_t, int64_t) {
    drop_pages(lo, hi, comm, "weights");
  });
}

void zero_other_blocks(const Tensor& arena, const GradBucket& b, const dist::Communicator& comm) {
  for_other_blocks(arena, b, comm, [&](char* lo, char* hi, int64_t at, int64_t n) {
    if (!arena.on_host()) return ops::fill(arena.narrow0(at, n), 0.f);
    // The whole pages read as zeros once handed back; the ends shared with
    // a neighbouring block are cleared in place.
    const auto [a, z] = drop_pages(lo, hi, comm, "gradients");
    if (a == z) return (void)std::memset(lo, 0, size_t(hi - lo));
    std::memset(lo, 0, size_t(a - lo));
    std::memset(z, 0, size_t(hi - z));
  });
}

void gather_master(Transformer& model, dist::Communicator& comm,
                   const std::vector<GradBucket>& buckets, dist::Communicator* experts) {
  std::vector<dist::WorkPtr> all;
  for (const GradBucket& b : buckets) {
    dist::Communicator& c = b.experts && experts ? *experts : comm;
    all.push_back(c.all_gather_v_async(model.params().narrow0(b.begin, b.numel()),
                                       shard_counts(b, c.size())));
  }
  for (auto& w : all) w->wait();
  model.sync_compute_params();
}

ShardedWeights::ShardedWeights(Transformer& model, dist::Communicator& comm,
                               std::vector<GradBucket> buckets, dist::Communicator* experts)
    : model_(model),
      comm_(comm),
      experts_(experts),
      buckets_(std::move(buckets)),
      units_(stage_buckets(model.layout(), model.config().n_layer, model.config().head_tied(),
                           buckets_)),
      state_(buckets_.size(), State::Released),
      work_(buckets_.size()) {
  NK_CHECK(model.device() == kHost, "ShardedWeights: host arenas only (madvise), got {}",
           device_name(model.device()));
  const bool separate_master = model.compute_params().raw() != model.params().raw();
  advise_huge_pages(model.compute_params());  // gathered and released every unit
  for (const GradBucket& b : buckets_) {
    release_other_blocks(model.compute_params(), b, group(b));
    if (separate_master) release_other_blocks(model.params(), b, group(b));
  }
}

void ShardedWeights::start_gather(size_t k) {
  if (state_[k] != State::Released) return;
  const GradBucket& b = buckets_[k];
  dist::Communicator& c = group(b);
  work_[k] = c.all_gather_v_async(model_.compute_params().narrow0(b.begin, b.numel()),
                                  shard_counts(b, c.size()));
  state_[k] = State::Pending;
}

void ShardedWeights::prefetch(int64_t unit) {
  for (size_t k : units_[size_t(unit)]) start_gather(k);
}

void ShardedWeights::gather(int64_t unit) {
  prefetch(unit);
  for (size_t k : units_[size_t(unit)]) {
    if (state_[k] != State::Pending) continue;
    work_[k]->wait();
    work_[k].reset();
    state_[k] = State::Resident;
  }
}

void ShardedWeights::release(int64_t unit) {
  for (size_t k : units_[size_t(unit)]) {
    NK_CHECK(state_[k] != State::Pending, "ShardedWeights: releasing bucket {} mid-gather", k);
    if (state_[k] == State::Released) continue;
    release_other_blocks(model_.compute_params(), buckets_[k], group(buckets_[k]));
    state_[k] = State::Released;
  }
}

void ShardedWeights::gather_all_master() {
  for (size_t k = 0; k < buckets_.size(); ++k)
    if (state_[k] == State::Pending) work_[k]->wait();
  if (model_.params().numel() > 0) {
    gather_master(model_, comm_, buckets_, experts_);
  } else {  // a bf16 master the optimizer keeps: the compute blocks are its bf16 part
    for (size_t k = 0; k < buckets_.size(); ++k) start_gather(k);
    for (size_t k = 0; k < buckets_.size(); ++k)
      if (state_[k] == State::Pending) work_[k]->wait();
  }
  std::fill(state_.begin(), state_.end(), State::Resident);
}

}  // namespace nk::parallel
