// Sequence packing: many variable-length documents into fixed-length rows of
// seq_len tokens, each row carrying its document boundaries so that attention
// never crosses a document (ops::attention_forward's cu_seqlens) and positions
// restart at 0 per document. This is what NeMo's packed-sequence preparation
// produces for SFT, done in memory.
//
// Algorithm: first-fit-decreasing by default. Pieces (documents, or parts of
// overlong documents) are sorted by length, longest first (ties by input
// order), and each goes into the first row, in opening order, with room for
// it; a new row is opened when none has. A max-tree over the rows' free space
// finds that row in O(log rows). `Sequential` instead keeps the input order and
// opens a new row whenever the next piece does not fit (greedy, order
// preserving, what a streaming packer does). `OnePerRow` puts each piece in a
// row of its own, padded: unpacked samples in the same layout.
//
// Documents longer than seq_len: `Split` (default) cuts them into pieces of
// seq_len tokens and a remainder; every token is kept, each piece is its own
// attention segment with positions from 0, and a piece's last token still
// predicts the document's next token (the first token of the next piece), as
// a fixed window over a long document would. `Truncate` keeps the first
// seq_len tokens and drops the rest (counted in dropped_tokens); the last kept
// token predicts the first dropped one.
//
// Per row: tokens; targets (the next token of the same document, or
// kIgnoreIndex = -100 for the last token of a document, for a token whose
// successor is masked out of the loss, and for padding); position ids; and the
// cumulative segment starts. Padding (pad_id, after the last document) forms
// one more segment so that no document attends to it.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace nk {

enum class PackAlgorithm { FirstFitDecreasing, Sequential, OnePerRow };
enum class OverlongPolicy { Split, Truncate };

struct PackingOptions {
  int64_t seq_len = 0;  // tokens per row, >= 1
  PackAlgorithm algorithm = PackAlgorithm::FirstFitDecreasing;
  OverlongPolicy overlong = OverlongPolicy::Split;
  int32_t pad_id = 0;
};

// A contiguous run of one document placed in a row.
struct PackedPiece {
  int64_t doc;     // index of the input document
  int64_t offset;  // first token of the piece within the document
  int64_t length;  // tokens; the piece occupies [start, start + length) of its row
  int64_t start;
};

struct PackedRows {
  static constexpr int32_t kIgnoreIndex = -100;

  int64_t seq_len = 0, n_rows = 0;
  int64_t max_segments = 0;  // most segments (pieces + padding) in any row
  // [n_rows, seq_len] each.
  std::vector<int32_t> tokens, targets, position_ids;
  // [n_rows, max_segments + 1]: 0 = c_0 <= ... = seq_len, repeating seq_len
  // after a row's last segment (the layout attention_forward takes).
  std::vector<int32_t> cu_seqlens;
  std::vector<std::vector<PackedPiece>> pieces;  // per row, in row order
  int64_t real_tokens = 0;                       // non-pad tokens placed
  int64_t dropped_tokens = 0;                    // cut off by OverlongPolicy::Truncate

  // Fraction of row positions holding document tokens (1 = no padding).
  double efficiency() const {
    return n_rows ? double(real_tokens) / double(n_rows * seq_len) : 0.0;
  }
  // Copies rows [row0, row0 + B) into CPU i32 tensors: tokens, targets,
  // positions [B, seq_len]; cu_seqlens [B, S+1] with S+1 at least each row's
  // segments + 1 (extra columns repeat seq_len). Any of them may be undefined.
  void fill_batch(int64_t row0, Tensor tokens, Tensor targets, Tensor positions,
                  Tensor cu_seqlens) const;
};

// docs: token ids per document (empty documents are skipped). loss_masks:
// empty, or one per document of the same length; loss_masks[d][i] == 0 means
// token i of document d is not predicted (the target at i-1 is ignored), e.g.
// the prompt of an SFT example. nk::Error for seq_len < 1 or mismatched masks.
PackedRows pack_documents(std::span<const std::vector<int32_t>> docs, const PackingOptions& opt,
                          std::span<const std::vector<uint8_t>> loss_masks = {});

}  // namespace nk
