// MinHash signatures of documents for near-duplicate detection with LSH.
//
// Shingles:
//   chars  every run of `ngram` consecutive Unicode code points of the raw
//          text (NeMo Curator: 24 characters). Code points, not bytes, so a
//          shingle spans the same amount of text in every script.
//   words  every run of `ngram` consecutive words (curate/words.h), each
//          lowercased with Unicode simple case mapping (FineWeb: 5 words).
// A text shorter than one shingle is one shingle of the whole text (an empty
// text is the one shingle of nothing, so all empty texts look alike).
//
// Each shingle is hashed once: XXH3-64 of its bytes (chars) or of its words'
// hashes (words), folded to 32 bits x. The k = bands x rows permutations are
// h_i(x) = a_i * x + b_i (mod 2^32) with odd a_i and random b_i from the seed;
// the signature is min over shingles of h_i, per i. Because x is already a
// uniform hash, each h_i (a bijection) gives every shingle a uniform,
// independent rank, and distinct (a_i, b_i) decorrelate the k minima. The
// min-reduction runs 16 hashes per AVX-512 instruction where the build targets it
// and falls back to a scalar loop with bit-identical results.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nk::curate {

enum class ShingleKind { kChars, kWords };

struct MinHashParams {
  ShingleKind kind = ShingleKind::kChars;
  int ngram = 24;  // code points (chars) or words
  int num_bands = 20;
  int rows_per_band = 13;
  uint64_t seed = 42;
  int num_hashes() const { return num_bands * rows_per_band; }
};

// "nemo": 24 chars, 20 bands x 13 rows (260 hashes, LSH threshold ~0.79);
// "fineweb": 5 words, 14 bands x 8 rows (112 hashes, threshold ~0.72).
// False for any other name.
bool minhash_preset(const std::string& name, MinHashParams& out);

class MinHasher {
 public:
  explicit MinHasher(const MinHashParams& p);
  const MinHashParams& params() const { return p_; }
  int num_hashes() const { return p_.num_hashes(); }

  // Appends the 32-bit hash of every shingle of `text` (valid UTF-8), in text
  // order, repeats included.
  void shingles(std::string_view text, std::vector<uint32_t>& out) const;
  // sig[0 .. num_hashes) = the minima over shingles[0 .. n); n >= 1.
  void signature(const uint32_t* shingles, size_t n, uint32_t* sig) const;
  // The plain reference of signature(), for tests.
  void signature_scalar(const uint32_t* shingles, size_t n, uint32_t* sig) const;
  // shingles() then signature(), with per-thread scratch.
  void signature(std::string_view text, uint32_t* sig) const;
  // The LSH bucket of one band: XXH3-64 of its rows, seeded by the band.
  uint64_t band_hash(const uint32_t* sig, int band) const;

 private:
  MinHashParams p_;
  size_t padded_ = 0;            // num_hashes rounded up to 16 lanes
  std::vector<uint32_t> a_, b_;  // padded_ each
};

// Fraction of equal positions of two signatures: the MinHash estimate of the
// Jaccard similarity.
double signature_similarity(const uint32_t* a, const uint32_t* b, int k);
// Sorts and removes repeats (a shingle set from shingles()).
void sort_unique(std::vector<uint32_t>& v);
// |A ∩ B| / |A ∪ B| of two sorted, repeat-free sets; 1 when both are empty.
double jaccard(const uint32_t* a, size_t na, const uint32_t* b, size_t nb);
// Appends `text` (valid UTF-8) lowercased with Unicode simple case mapping.
void append_lowercase(std::string_view text, std::string& out);

}  // namespace nk::curate
