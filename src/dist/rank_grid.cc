#include "dist/rank_grid.h"

#include "core/error.h"

namespace nk::dist {

std::vector<std::string> split_order(const std::string& order) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dash = order.find('-', start);
    parts.push_back(order.substr(start, dash == std::string::npos ? dash : dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  return parts;
}

RankGrid::RankGrid(std::vector<Dim> dims) : dims_(std::move(dims)) {
  for (auto& d : dims_) {
    NK_CHECK(d.size >= 1, "dimension {} has size {}", d.name, d.size);
    strides_.push_back(world_);
    world_ *= d.size;
  }
}

int RankGrid::index(const std::string& dim) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == dim) return int(i);
  NK_CHECK(false, "no dimension '{}' in the rank grid", dim);
  return -1;
}

int RankGrid::size(const std::string& dim) const {
  return dims_[index(dim)].size;
}

int RankGrid::coord(int rank, const std::string& dim) const {
  int i = index(dim);
  return (rank / strides_[i]) % dims_[i].size;
}

std::vector<bool> RankGrid::mask(const std::string& token) const {
  std::vector<bool> m(dims_.size(), false);
  for (auto& name : split_order(token)) m[index(name)] = true;
  return m;
}

// Group g's members: its index g decomposes (first free dimension fastest)
// into the coordinates of the dimensions outside the token; the member index
// j decomposes likewise into the coordinates along the token's dimensions.
std::vector<std::vector<int>> RankGrid::groups(const std::string& token) const {
  auto m = mask(token);
  int group_size = 1;
  for (size_t i = 0; i < dims_.size(); ++i)
    if (m[i]) group_size *= dims_[i].size;
  int n_groups = world_ / group_size;
  std::vector<std::vector<int>> out(n_groups, std::vector<int>(group_size));
  for (int g = 0; g < n_groups; ++g) {
    int base = 0, rest = g;
    for (size_t i = 0; i < dims_.size(); ++i) {
      if (m[i]) continue;
      base += (rest % dims_[i].size) * strides_[i];
      rest /= dims_[i].size;
    }
    for (int j = 0; j < group_size; ++j) {
      int rank = base, r = j;
      for (size_t i = 0; i < dims_.size(); ++i) {
        if (!m[i]) continue;
        rank += (r % dims_[i].size) * strides_[i];
        r /= dims_[i].size;
      }
      out[g][j] = rank;
    }
  }
  return out;
}

std::vector<int> RankGrid::group_of(int rank, const std::string& token) const {
  NK_CHECK(rank >= 0 && rank < world_, "rank {} outside a world of {}", rank, world_);
  auto m = mask(token);
  // Zero this rank's coordinates along the token, then walk the token's dimensions.
  int base = rank;
  for (size_t i = 0; i < dims_.size(); ++i)
    if (m[i]) base -= coord(rank, dims_[i].name) * strides_[i];
  std::vector<int> members{base};
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (!m[i]) continue;
    std::vector<int> grown;
    grown.reserve(members.size() * dims_[i].size);
    for (int c = 0; c < dims_[i].size; ++c)
      for (int r : members) grown.push_back(r + c * strides_[i]);
    members = std::move(grown);
  }
  return members;
}

}  // namespace nk::dist
