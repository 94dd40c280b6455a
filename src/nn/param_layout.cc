#include "nn/param_layout.h"

#include <algorithm>
#include <cstring>

#include "core/limits.h"

namespace nk {

const char* split_name(Split s) {
  switch (s) {
    case Split::Replicated:
      return "replicated";
    case Split::Rows:
      return "rows";
    case Split::Cols:
      return "cols";
    case Split::Experts:
      return "experts";
  }
  return "?";
}

const ParamPart& ParamInfo::part(const std::string& part_name) const {
  for (const ParamPart& p : parts)
    if (p.name == part_name) return p;
  fail("parameter '{}' has no part '{}'", name, part_name);
}

namespace {

int64_t share(const ParamInfo& p, int64_t extent, int64_t n, const std::string& what) {
  if (extent % n)
    fail("parameter '{}': {} of {} cannot be split evenly over {} ranks", p.name, what, extent, n);
  return extent / n;
}

}  // namespace

int64_t padded_rows(int64_t rows, int64_t multiple, int64_t n) {
  NK_CHECK(rows >= 0 && multiple >= 0 && n >= 1, "padded_rows: {} rows, multiple {}, {} ranks",
           rows, multiple, n);
  if (n == 1 || multiple == 0) return rows;
  const int64_t m = checked_mul(multiple, n, "vocabulary padding");
  return checked_mul((rows + m - 1) / m, m, "vocabulary padding");
}

ParamOptions param_options(const ParamInfo& p) {
  ParamOptions o;
  o.split = p.split;
  o.adapter = p.adapter;
  o.pad_multiple = p.pad_multiple;
  o.expert_split = p.expert_split;
  o.tp_ways = p.tp_ways;
  for (const ParamPart& q : p.parts) o.parts.emplace_back(q.name, q.rows);
  return o;
}

ParamInfo tensor_split(const ParamInfo& p) {
  if (p.split != Split::Experts) return p;
  ParamInfo t = p;
  t.split = p.expert_split;
  return t;
}

std::vector<SliceRange> shard_ranges(const ParamInfo& p, int64_t rank, int64_t n,
                                     const std::string& part) {
  NK_CHECK(n >= 1 && rank >= 0 && rank < n, "shard_ranges: rank {} of {}", rank, n);
  if (p.tp_ways > 0 && n > 1 && p.split != Split::Experts) {
    NK_CHECK(n % p.tp_ways == 0, "shard_ranges: '{}' split {} ways of {} ranks", p.name, p.tp_ways,
             n);
    rank %= p.tp_ways;
    n = p.tp_ways;
  }
  const ParamPart* one = part.empty() ? nullptr : &p.part(part);
  if (p.split == Split::Cols) {
    NK_CHECK(!one, "shard_ranges: parameter '{}' is split on columns, not by part", p.name);
    NK_CHECK(p.shape.size() == 2, "shard_ranges: column split of {}-d '{}'", p.shape.size(),
             p.name);
    const int64_t s = share(p, p.shape[1], n, "columns");
    return {{1, rank * s, s, 0}};
  }
  if (p.split == Split::Experts) {
    // Whole fused parts (or rows) in n contiguous blocks.
    const int64_t units = p.parts.empty() ? p.shape[0] : int64_t(p.parts.size());
    const int64_t s = share(p, units, n, p.parts.empty() ? "rows" : "fused parts");
    if (p.parts.empty()) return {{0, rank * s, s, 0}};
    const ParamPart &first = p.parts[size_t(rank * s)], &last = p.parts[size_t(rank * s + s - 1)];
    if (!one) return {{0, first.row0, last.row0 + last.rows - first.row0, 0}};
    if (one->row0 < first.row0 || one->row0 > last.row0) return {};  // another rank's
    return {{0, one->row0, one->rows, one->row0 - first.row0}};
  }
  const int64_t ways = p.split == Split::Rows ? n : 1, r = p.split == Split::Rows ? rank : 0;
  if (p.pad_multiple > 0 && ways > 1) {
    NK_CHECK(!one && p.parts.empty(), "shard_ranges: padded parameter '{}' with fused parts",
             p.name);
    const int64_t s = padded_rows(p.shape[0], p.pad_multiple, ways) / ways;
    const int64_t len = std::clamp<int64_t>(p.shape[0] - r * s, 0, s);
    if (len == 0) return {};
    return {{0, r * s, len, 0}};
  }
  if (one) {
    const int64_t s = share(p, one->rows, ways, "part '" + one->name + "' rows");
    return {{0, one->row0 + r * s, s, 0}};
  }
  if (p.parts.empty() || ways == 1) {
    const int64_t s = share(p, p.shape[0], ways, "rows");
    return {{0, r * s, s, 0}};
  }
  std::vector<SliceRange> out;
  int64_t local = 0;
  for (const ParamPart& q : p.parts) {
    const int64_t s = share(p, q.rows, ways, "part '" + q.name + "' rows");
    out.push_back({0, q.row0 + r * s, s, local});
    local += s;
  }
  return out;
}

Shape shard_shape(const ParamInfo& p, int64_t n, const std::string& part) {
  if (p.tp_ways > 0 && n > 1 && p.split != Split::Experts) n = p.tp_ways;
  Shape s = p.shape;
  if (p.pad_multiple > 0 && p.split == Split::Rows && n > 1 && part.empty()) {
    s[0] = padded_rows(p.shape[0], p.pad_multiple, n) / n;
    return s;
  }
  int64_t extent = 0;
  int dim = 0;
  for (const SliceRange& r : shard_ranges(p, 0, n, part)) {
    extent += r.len;
    dim = r.dim;
  }
  s[size_t(dim)] = extent;
  return s;
}

namespace {

// Each range of rank r's shard: the whole's bytes and the shard's, copied one way or the other.
void copy_shard(const ParamInfo& p, int64_t rank, int64_t n, size_t elem, const char* whole,
                char* shard, bool to_shard) {
  const Shape local = shard_shape(p, n);
  const int64_t inner = p.numel() / p.shape[0];  // elements per row of the whole
  const std::vector<SliceRange> ranges = shard_ranges(p, rank, n);
  if (to_shard && p.pad_multiple > 0 && p.split == Split::Rows && n > 1) {
    // The rows past the real ones (vocabulary padding) are zero.
    const int64_t real = ranges.empty() ? 0 : ranges[0].len;
    std::memset(shard + size_t(real * inner) * elem, 0, size_t((local[0] - real) * inner) * elem);
  }
  for (const SliceRange& r : ranges) {
    if (r.dim == 0) {
      const size_t bytes = size_t(r.len * inner) * elem;
      const char* src = to_shard ? whole + size_t(r.start * inner) * elem
                                 : shard + size_t(r.local_start * inner) * elem;
      char* dst = to_shard ? shard + size_t(r.local_start * inner) * elem
                           : const_cast<char*>(whole) + size_t(r.start * inner) * elem;
      std::memcpy(dst, src, bytes);
      continue;
    }
    // Columns [start, start + len) of every row: a row-parallel weight.
    const int64_t cols = p.shape[1], lcols = local[1];
    for (int64_t i = 0; i < p.shape[0]; ++i) {
      char* w = const_cast<char*>(whole) + size_t(i * cols + r.start) * elem;
      char* sh = shard + size_t(i * lcols + r.local_start) * elem;
      if (to_shard)
        std::memcpy(sh, w, size_t(r.len) * elem);
      else
        std::memcpy(w, sh, size_t(r.len) * elem);
    }
  }
}

}  // namespace

void extract_shard(const ParamInfo& p, int64_t rank, int64_t n, size_t elem, const void* whole,
                   void* shard) {
  copy_shard(p, rank, n, elem, static_cast<const char*>(whole), static_cast<char*>(shard), true);
}

void insert_shard(const ParamInfo& p, int64_t rank, int64_t n, size_t elem, const void* shard,
                  void* whole) {
  copy_shard(p, rank, n, elem, static_cast<const char*>(whole),
             const_cast<char*>(static_cast<const char*>(shard)), false);
}

namespace {

// The parameters `keep` accepts, each split ways(p) ways; over the
// tensor-parallel group (`tensor`: expert tensors by tensor_split, keeping
// every expert's parts) or the expert-parallel one.
ParamLayout derived_layout(const std::vector<ParamInfo>& params,
                           const std::function<int64_t(const ParamInfo&)>& ways,
                           const std::function<bool(const ParamInfo&)>& keep, bool tensor) {
  ParamLayout out;
  for (const ParamInfo& whole : params) {
    if (!keep(whole)) continue;
    const ParamInfo p = tensor ? tensor_split(whole) : whole;
    const int64_t n = ways(whole);
    ParamOptions o = param_options(whole);
    if (p.split == Split::Experts && n > 1) o.parts.clear();  // this rank's experts only
    if (p.split != Split::Cols)  // (a column split keeps each part's rows)
      for (auto& [part, rows] : o.parts) rows = shard_shape(p, n, part)[0];
    if (n > 1) o.pad_multiple = 0;  // a shard holds its padding; it is not split again
    out.add(p.name, shard_shape(p, n), p.init, p.init_std, o);
    if (!p.trainable) out.freeze(p.name);
    if (p.quantized) out.quantize(p.name);
  }
  out.finalize();
  return out;
}

}  // namespace

ParamLayout ParamLayout::shard(int64_t n) const {
  NK_CHECK(final_, "ParamLayout::shard before finalize");
  return derived_layout(
      params_, [n](const ParamInfo&) { return n; }, [](const ParamInfo&) { return true; }, true);
}

ParamLayout ParamLayout::shard_experts(int64_t n) const {
  NK_CHECK(final_, "ParamLayout::shard_experts before finalize");
  return derived_layout(
      params_, [n](const ParamInfo& p) { return p.split == Split::Experts ? n : int64_t(1); },
      [](const ParamInfo&) { return true; }, false);
}

ParamLayout ParamLayout::replicated(const std::function<bool(const ParamInfo&)>& which) const {
  ParamLayout out = *this;
  for (ParamInfo& p : out.params_) {
    if (!which(p)) continue;
    if (p.split != Split::Experts) p.split = Split::Replicated;
    p.expert_split = Split::Replicated;
  }
  return out;
}

ParamLayout ParamLayout::split_over(const std::function<bool(const ParamInfo&)>& which,
                                    int64_t ways) const {
  NK_CHECK(ways >= 1, "ParamLayout::split_over {} ways", ways);
  ParamLayout out = *this;
  for (ParamInfo& p : out.params_)
    if (which(p)) p.tp_ways = ways;
  return out;
}

ParamLayout ParamLayout::subset(const std::function<bool(const ParamInfo&)>& keep) const {
  NK_CHECK(final_, "ParamLayout::subset before finalize");
  return derived_layout(
      params_, [](const ParamInfo&) { return int64_t(1); }, keep, false);
}

void ParamLayout::add(const std::string& name, const Shape& shape, Init init, float init_std,
                      const ParamOptions& opt) {
  NK_CHECK(!final_, "add after finalize");
  NK_CHECK(!index_.count(name), "duplicate parameter {}", name);
  NK_CHECK(!shape.empty(), "parameter {} has no dimensions", name);
  NK_CHECK(opt.split != Split::Cols || shape.size() == 2, "parameter {}: column split of {}-d",
           name, shape.size());
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.init = init;
  p.init_std = init_std;
  p.decay = shape.size() >= 2;
  p.split = opt.split;
  p.adapter = opt.adapter;
  p.pad_multiple = opt.pad_multiple;
  p.expert_split = opt.expert_split;
  p.tp_ways = opt.tp_ways;
  NK_CHECK(opt.expert_split == Split::Replicated ||
               (opt.split == Split::Experts &&
                (opt.expert_split == Split::Rows || opt.expert_split == Split::Cols)),
           "parameter {}: an expert split ({}) of a {} parameter", name,
           split_name(opt.expert_split), split_name(opt.split));
  NK_CHECK(opt.pad_multiple >= 0 &&
               (opt.pad_multiple == 0 || (opt.split == Split::Rows && opt.parts.empty())),
           "parameter {}: vocabulary padding ({}) needs an unfused row split", name,
           opt.pad_multiple);
  int64_t row = 0;
  for (const auto& [part, rows] : opt.parts) {
    p.parts.push_back({part, row, rows});
    row += rows;
  }
  NK_CHECK(p.parts.empty() || row == shape[0], "parameter {}: parts cover {} of {} rows", name, row,
           shape[0]);
  index_[name] = params_.size();
  params_.push_back(p);
}

void ParamLayout::freeze(const std::string& name) {
  NK_CHECK(!final_, "freeze after finalize");
  auto it = index_.find(name);
  if (it == index_.end()) fail("no parameter named '{}' to freeze", name);
  params_[it->second].trainable = false;
}

void ParamLayout::quantize(const std::string& name) {
  NK_CHECK(!final_, "quantize after finalize");
  auto it = index_.find(name);
  if (it == index_.end()) fail("no parameter named '{}' to quantize", name);
  NK_CHECK(!params_[it->second].trainable, "quantize: parameter {} is trainable", name);
  params_[it->second].quantized = true;
}

void ParamLayout::finalize() {
  std::stable_partition(params_.begin(), params_.end(), [](const ParamInfo& p) { return p.decay; });
  for (size_t i = 0; i < params_.size(); ++i) index_[params_[i].name] = i;
  // Trainable parameters first (decayed, then not), frozen ones last and the
  // quantised among them after the others: with nothing frozen this is one
  // pass in params_ order.
  int64_t off = 0;
  enum Group { Trainable, Frozen, Quantized };
  for (Group g : {Trainable, Frozen, Quantized}) {
    if (g == Quantized) dense_end_ = off;
    for (auto& p : params_) {
      if ((p.trainable ? Trainable : p.quantized ? Quantized : Frozen) != g) continue;
      const bool trainable = g == Trainable;
      p.offset = off;
      // keep every view 64-byte aligned in f32
      off = checked_add(off, (checked_add(p.numel(), 15, "parameters") / 16) * 16, "parameters");
      if (trainable && p.decay) decay_end_ = off;
      if (trainable) trainable_end_ = off;
    }
  }
  total_ = off;
  check_limit("", "parameters", total_, limits::kElements, "elements");
  final_ = true;
}

const ParamInfo& ParamLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("no parameter named '{}'", name);
  return params_[it->second];
}

int64_t ParamLayout::count() const {
  int64_t n = 0;
  for (auto& p : params_) n += p.numel();
  return n;
}

Tensor ParamLayout::view(const Tensor& flat, const ParamInfo& p) {
  return flat.narrow0(p.offset, p.numel()).view(p.shape);
}

Tensor ParamLayout::part_view(const Tensor& flat, const ParamInfo& p, const std::string& part) {
  const ParamPart& q = p.part(part);
  return view(flat, p).narrow0(q.row0, q.rows);
}

}  // namespace nk
