// Megatron-Core's indexed dataset, byte for byte: PREFIX.bin holds the tokens of
// every sequence back to back; PREFIX.idx is
//   "MMIDIDX\0\0"  u64 version=1  u8 dtype code  u64 n_seq  u64 n_doc_idx
//   i32 lengths[n_seq]  i64 byte_offsets[n_seq]  i64 doc_idx[n_doc_idx]
// all little-endian. doc_idx starts at 0 and holds, after each document, the
// index one past its last sequence (so n_doc_idx = documents + 1). Dtype codes:
// 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16 (tokens use u16 or i32).
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace nk {

class AtomicFileWriter;

enum class IndexDType : uint8_t {
  U8 = 1,
  I8 = 2,
  I16 = 3,
  I32 = 4,
  I64 = 5,
  F64 = 6,
  F32 = 7,
  U16 = 8
};
int64_t index_dtype_size(IndexDType t);
const char* index_dtype_name(IndexDType t);
// Megatron's choice: u16 when every id fits (vocab < 65500), else i32.
IndexDType token_dtype_for_vocab(int64_t vocab_size);

// Streams a dataset to PREFIX.bin/.idx. Memory stays constant: lengths and
// document ends go to anonymous temporary files until finish(). Nothing appears
// under the final names before finish(); destroying an unfinished writer (an
// error, a kill) leaves no .bin or .idx behind (an old .idx is removed first).
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, IndexDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One sequence; nk::Error if a token does not fit the dtype.
  void add_sequence(std::span<const int32_t> tokens);
  void end_document();  // the sequences since the last end form one document
  void add_document(std::span<const int32_t> tokens) {
    add_sequence(tokens);
    end_document();
  }
  void finish();  // writes the index, then renames both files into place

  int64_t sequences() const { return n_seq_; }
  int64_t documents() const { return n_doc_; }
  int64_t tokens() const { return n_tok_; }

 private:
  std::string prefix_;
  IndexDType dtype_;
  std::unique_ptr<AtomicFileWriter> bin_;
  std::FILE* lengths_ = nullptr;   // i32 per sequence, unlinked temporary
  std::FILE* doc_ends_ = nullptr;  // i64 per document, unlinked temporary
  std::vector<char> conv_;
  int64_t n_seq_ = 0, n_doc_ = 0, n_tok_ = 0;
  bool finished_ = false;
};

// Read-only, memory-mapped view of PREFIX.bin/.idx. open() checks the whole
// index against both file sizes and names the file and byte offset of the first
// inconsistency (truncated file, bad magic, offsets that disagree with lengths).
class IndexedDataset {
 public:
  static std::shared_ptr<const IndexedDataset> open(const std::string& prefix);
  ~IndexedDataset();

  const std::string& prefix() const { return prefix_; }
  IndexDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return n_seq_; }
  int64_t num_documents() const { return int64_t(doc_idx_.size()) - 1; }
  int64_t num_tokens() const { return n_tokens_; }
  // The index arrays, copied out of the file (they sit at unaligned offsets).
  const std::vector<int32_t>& lengths() const { return lengths_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  const std::vector<int64_t>& doc_idx() const { return doc_idx_; }

  // Tokens [start, start + count) of sequence `seq` as int32, into out.
  void read(int64_t seq, int64_t start, int64_t count, int32_t* out) const;
  std::vector<int32_t> sequence(int64_t seq) const;

  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

 private:
  IndexedDataset() = default;
  std::string prefix_;
  IndexDType dtype_ = IndexDType::U16;
  int64_t n_seq_ = 0, n_tokens_ = 0;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> offsets_, doc_idx_;
  const char* bin_ = nullptr;  // mmap of PREFIX.bin
  size_t bin_bytes_ = 0;
};

}  // namespace nk
