#include "data/dataset/data_loader.h"

#include <cstring>

#include "core/error.h"

namespace nk {

DataLoader::DataLoader(std::shared_ptr<const SampleDataset> data, int64_t micro_batch,
                       int64_t vocab_size)
    : data_(std::move(data)), B_(micro_batch), vocab_(vocab_size) {
  NK_CHECK(data_ != nullptr, "DataLoader needs a dataset");
  if (B_ <= 0) fail("micro batch must be positive, got {}", B_);
  buf_.resize(size_t(data_->seq_len() + 1));
}

void DataLoader::set_consumed_samples(int64_t n) {
  if (n < 0 || n > data_->size())
    fail("{}: cannot resume at sample {}; it holds {} samples", data_->name(), n, data_->size());
  consumed_ = n;
}

void DataLoader::next(Tensor inputs, Tensor targets) {
  const int64_t T = data_->seq_len();
  for (const Tensor* t : {&inputs, &targets}) {
    const char* what = t == &inputs ? "inputs" : "targets";
    check_shape(*t, {B_, T}, what);
    check_dtype(*t, DType::I32, what);
    NK_CHECK(t->on_host() && t->is_contiguous(), "loader output must be host memory, dense");
  }
  if (consumed_ + B_ > data_->size())
    fail("{}: out of samples: {} read, {} more wanted, {} in all", data_->name(), consumed_, B_,
         data_->size());
  int32_t* x = inputs.data<int32_t>();
  int32_t* y = targets.data<int32_t>();
  for (int64_t b = 0; b < B_; ++b) {
    int64_t i = consumed_ + b;
    data_->sample(i, buf_.data());
    if (vocab_ > 0)
      for (int64_t t = 0; t <= T; ++t)
        if (buf_[size_t(t)] < 0 || buf_[size_t(t)] >= vocab_)
          fail("{}: token id {} is outside the model's vocabulary [0, {}) (model.vocab_size)",
               data_->describe(i), buf_[size_t(t)], vocab_);
    std::memcpy(x + b * T, buf_.data(), size_t(T) * sizeof(int32_t));
    std::memcpy(y + b * T, buf_.data() + 1, size_t(T) * sizeof(int32_t));
  }
  consumed_ += B_;
}

}  // namespace nk
