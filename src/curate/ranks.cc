#include "curate/ranks.h"

#include "core/tensor.h"
#include "dist/communicator.h"
#include "dist/strings.h"

namespace nk::curate {

int Ranks::rank() const {
  return comm_ ? comm_->rank() : 0;
}

int Ranks::size() const {
  return comm_ ? comm_->size() : 1;
}

void Ranks::barrier() const {
  if (comm_) comm_->barrier();
}

std::vector<std::string> Ranks::exchange(const std::vector<std::string>& send) const {
  return comm_ ? dist::exchange_strings(*comm_, send) : send;
}

std::vector<std::string> Ranks::all_gather(const std::string& mine) const {
  return comm_ ? dist::all_gather_strings(*comm_, mine) : std::vector<std::string>{mine};
}

int64_t Ranks::sum(int64_t x) const {
  if (!comm_) return x;
  comm_->all_reduce(Tensor::from_blob(&x, {1}, DType::I64));
  return x;
}

std::pair<size_t, size_t> Ranks::block(size_t n) const {
  size_t r = size_t(rank()), s = size_t(size());
  return {n * r / s, n * (r + 1) / s};
}

}  // namespace nk::curate
