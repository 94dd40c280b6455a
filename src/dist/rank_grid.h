// RankGrid: world ranks laid out on an ordered grid of named dimensions, the
// layout of Megatron-Core's RankGenerator. With dimensions d0-d1-...-dk (d0
// varies fastest):
//   rank = c0 + c1*s0 + c2*s0*s1 + ...   (ci = coordinate along di, si its size)
// A group over a subset of dimensions ("dp-cp") holds the ranks that agree on
// every other coordinate. Its members are ordered by their coordinates along
// the chosen dimensions, first named in the *grid's* order varying fastest,
// so "dp-cp" and "cp-dp" name the same group in the same member order.
#pragma once
#include <string>
#include <vector>

namespace nk::dist {

class RankGrid {
 public:
  struct Dim {
    std::string name;
    int size;
  };
  RankGrid() = default;
  // Sizes must be >= 1; names distinct (checked by the caller, which knows the config keys).
  explicit RankGrid(std::vector<Dim> dims);

  int world_size() const { return world_; }
  const std::vector<Dim>& dims() const { return dims_; }
  int size(const std::string& dim) const;
  int coord(int rank, const std::string& dim) const;

  // Every group over the dimensions in `token` ("dp", "tp-pp", "dp-cp"): world
  // / group size groups, in the order Megatron enumerates them (by the other
  // dimensions' coordinates, the grid's first dimension fastest).
  std::vector<std::vector<int>> groups(const std::string& token) const;
  // The one group of `token` that holds `rank`.
  std::vector<int> group_of(int rank, const std::string& token) const;

 private:
  std::vector<bool> mask(const std::string& token) const;
  int index(const std::string& dim) const;  // NK_CHECKs that it exists

  std::vector<Dim> dims_;
  std::vector<int> strides_;  // stride of dims_[i] in world ranks
  int world_ = 1;
};

// Splits "tp-cp-ep-dp-pp" at '-'; empty parts are kept (and refused by callers).
std::vector<std::string> split_order(const std::string& order);

}  // namespace nk::dist
