#include "data/dataset/epoch_order.h"

#include <utility>

#include "core/rng.h"

namespace nk {

int64_t EpochOrder::at(int64_t i) const {
  const int64_t epoch = i / n_, j = i % n_;
  if (!shuffle_) return j;
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch != epoch_) {  // Fisher-Yates with this epoch's stream
    order_.resize(size_t(n_));
    for (int64_t k = 0; k < n_; ++k) order_[size_t(k)] = k;
    Rng rng(seed_ * 1000003u + uint64_t(epoch));
    for (int64_t k = n_ - 1; k > 0; --k)
      std::swap(order_[size_t(k)], order_[size_t(rng.below(uint64_t(k + 1)))]);
    epoch_ = epoch;
  }
  return order_[size_t(j)];
}

}  // namespace nk
