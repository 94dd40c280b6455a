#include "data/dataset/packing.h"

#include <algorithm>

#include "core/error.h"

namespace nk {
namespace {

// Leftmost bin whose free space is >= n, over a fixed number of bins that all
// start empty (capacity `cap`): a max-tree over the free space. Bins are used
// in index order, so "leftmost" is "first opened".
class FirstFit {
 public:
  FirstFit(int64_t bins, int64_t cap) {
    while (size_ < bins) size_ *= 2;
    free_.assign(size_t(2 * size_), 0);
    for (int64_t i = 0; i < bins; ++i) free_[size_t(size_ + i)] = cap;
    for (int64_t i = size_ - 1; i >= 1; --i) free_[size_t(i)] = std::max(left(i), right(i));
  }
  // Index of the bin that takes n tokens (its free space shrinks by n).
  int64_t place(int64_t n) {
    NK_CHECK(free_[1] >= n, "first-fit: no bin holds {} tokens", n);
    int64_t i = 1;
    while (i < size_) i = left(i) >= n ? 2 * i : 2 * i + 1;
    free_[size_t(i)] -= n;
    for (int64_t p = i / 2; p >= 1; p /= 2) free_[size_t(p)] = std::max(left(p), right(p));
    return i - size_;
  }

 private:
  int64_t left(int64_t i) const { return free_[size_t(2 * i)]; }
  int64_t right(int64_t i) const { return free_[size_t(2 * i + 1)]; }
  int64_t size_ = 1;
  std::vector<int64_t> free_;
};

struct Piece {
  int64_t doc, offset, length;
};

// The pieces each document contributes under the overlong policy, in input order.
std::vector<Piece> cut_pieces(std::span<const std::vector<int32_t>> docs, const PackingOptions& opt,
                              int64_t& dropped) {
  std::vector<Piece> pieces;
  for (size_t d = 0; d < docs.size(); ++d) {
    const int64_t n = int64_t(docs[d].size());
    if (opt.overlong == OverlongPolicy::Truncate) {
      if (n > 0) pieces.push_back({int64_t(d), 0, std::min(n, opt.seq_len)});
      dropped += std::max<int64_t>(0, n - opt.seq_len);
      continue;
    }
    for (int64_t off = 0; off < n; off += opt.seq_len)
      pieces.push_back({int64_t(d), off, std::min(opt.seq_len, n - off)});
  }
  return pieces;
}

}  // namespace

PackedRows pack_documents(std::span<const std::vector<int32_t>> docs, const PackingOptions& opt,
                          std::span<const std::vector<uint8_t>> loss_masks) {
  if (opt.seq_len < 1) fail("packing: seq_len must be at least 1, got {}", opt.seq_len);
  if (!loss_masks.empty() && loss_masks.size() != docs.size())
    fail("packing: {} loss masks for {} documents", loss_masks.size(), docs.size());
  for (size_t d = 0; d < loss_masks.size(); ++d)
    if (loss_masks[d].size() != docs[d].size())
      fail("packing: document {} has {} tokens but a loss mask of {}", d, docs[d].size(),
           loss_masks[d].size());

  PackedRows r;
  r.seq_len = opt.seq_len;
  std::vector<Piece> pieces = cut_pieces(docs, opt, r.dropped_tokens);

  // Assign pieces to rows.
  if (opt.algorithm == PackAlgorithm::FirstFitDecreasing) {
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const Piece& a, const Piece& b) { return a.length > b.length; });
    FirstFit bins(int64_t(pieces.size()), opt.seq_len);
    for (const Piece& p : pieces) {
      const int64_t row = bins.place(p.length);
      if (row >= int64_t(r.pieces.size())) r.pieces.resize(size_t(row + 1));
      const auto& placed = r.pieces[size_t(row)];
      const int64_t start = placed.empty() ? 0 : placed.back().start + placed.back().length;
      r.pieces[size_t(row)].push_back({p.doc, p.offset, p.length, start});
    }
  } else {
    int64_t used = opt.seq_len;  // of the current row; forces a first row
    for (const Piece& p : pieces) {
      if (used + p.length > opt.seq_len || opt.algorithm == PackAlgorithm::OnePerRow) {
        r.pieces.emplace_back();
        used = 0;
      }
      r.pieces.back().push_back({p.doc, p.offset, p.length, used});
      used += p.length;
    }
  }

  // Fill the rows.
  const int64_t T = opt.seq_len;
  r.n_rows = int64_t(r.pieces.size());
  for (const auto& row : r.pieces) {
    const int64_t end = row.empty() ? 0 : row.back().start + row.back().length;
    r.max_segments = std::max(r.max_segments, int64_t(row.size()) + (end < T ? 1 : 0));
  }
  const int64_t S1 = r.max_segments + 1;
  r.tokens.assign(size_t(r.n_rows * T), opt.pad_id);
  r.targets.assign(size_t(r.n_rows * T), PackedRows::kIgnoreIndex);
  r.position_ids.assign(size_t(r.n_rows * T), 0);
  r.cu_seqlens.assign(size_t(r.n_rows * S1), int32_t(T));
  for (int64_t row = 0; row < r.n_rows; ++row) {
    int32_t* tok = r.tokens.data() + row * T;
    int32_t* tgt = r.targets.data() + row * T;
    int32_t* pos = r.position_ids.data() + row * T;
    int32_t* cu = r.cu_seqlens.data() + row * S1;
    int64_t seg = 0, end = 0;
    for (const PackedPiece& p : r.pieces[size_t(row)]) {
      const std::vector<int32_t>& doc = docs[size_t(p.doc)];
      const uint8_t* mask = loss_masks.empty() ? nullptr : loss_masks[size_t(p.doc)].data();
      cu[seg++] = int32_t(p.start);
      for (int64_t i = 0; i < p.length; ++i) {
        const int64_t src = p.offset + i, dst = p.start + i;
        tok[dst] = doc[size_t(src)];
        pos[dst] = int32_t(i);
        const bool has_next = src + 1 < int64_t(doc.size()) && (!mask || mask[src + 1]);
        if (has_next) tgt[dst] = doc[size_t(src + 1)];
      }
      r.real_tokens += p.length;
      end = p.start + p.length;
    }
    if (end < T) {  // padding: its own segment, positions from 0
      cu[seg++] = int32_t(end);
      for (int64_t t = end; t < T; ++t) pos[t] = int32_t(t - end);
    }
    // cu[seg..S] already hold T.
  }
  return r;
}

void PackedRows::fill_batch(int64_t row0, Tensor tok, Tensor tgt, Tensor pos, Tensor cu) const {
  int64_t B = -1;
  for (const Tensor* t : {&tok, &tgt, &pos, &cu})
    if (t->defined()) B = t->dim(0);
  NK_CHECK(B >= 0 && row0 >= 0 && row0 + B <= n_rows, "fill_batch: rows [{}, {}) of {}", row0,
           row0 + B, n_rows);
  const int64_t T = seq_len, S1 = max_segments + 1;
  auto copy_rows = [&](Tensor& t, const std::vector<int32_t>& src, const char* name) {
    if (!t.defined()) return;
    check_shape(t, {B, T}, name);
    check_dtype(t, DType::I32, name);
    NK_CHECK(t.is_contiguous(), "fill_batch: {} is not contiguous", name);
    std::copy_n(src.data() + row0 * T, B * T, t.data<int32_t>());
  };
  copy_rows(tok, tokens, "tokens");
  copy_rows(tgt, targets, "targets");
  copy_rows(pos, position_ids, "positions");
  if (!cu.defined()) return;
  check_dtype(cu, DType::I32, "cu_seqlens");
  NK_CHECK(cu.ndim() == 2 && cu.dim(0) == B && cu.is_contiguous(),
           "fill_batch: cu_seqlens {} is not [B={}, S+1]", cu.desc(), B);
  const int64_t W = cu.dim(1);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* src = cu_seqlens.data() + (row0 + b) * S1;
    const int64_t used = std::find(src, src + S1, int32_t(T)) - src + 1;  // through the first T
    NK_CHECK(W >= used, "fill_batch: row {} has {} segments, cu_seqlens holds {}", row0 + b,
             used - 1, W - 1);
    int32_t* dst = cu.data<int32_t>() + b * W;
    std::copy_n(src, used, dst);
    std::fill(dst + used, dst + W, int32_t(T));
  }
}

}  // namespace nk
