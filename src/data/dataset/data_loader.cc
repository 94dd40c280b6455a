#include "data/dataset/data_loader.h"

#include <algorithm>
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

void DataLoader::next(Tensor inputs, Tensor targets, Tensor positions, Tensor cu_seqlens) {
  const int64_t T = data_->seq_len(), S1 = data_->max_segments() + 1;
  auto check = [&](const Tensor& t, const Shape& shape, const char* what) {
    check_shape(t, shape, what);
    check_dtype(t, DType::I32, what);
    NK_CHECK(t.on_host() && t.is_contiguous(), "loader output must be host memory, dense");
  };
  check(inputs, {B_, T}, "inputs");
  check(targets, {B_, T}, "targets");
  if (positions.defined()) check(positions, {B_, T}, "positions");
  if (cu_seqlens.defined()) check(cu_seqlens, {B_, S1}, "cu_seqlens");
  if (consumed_ + B_ > data_->size())
    fail("{}: out of samples: {} read, {} more wanted, {} in all", data_->name(), consumed_, B_,
         data_->size());
  int32_t* x = inputs.data<int32_t>();
  int32_t* y = targets.data<int32_t>();
  if (rows()) {
    std::vector<int32_t> pos(static_cast<size_t>(T)), cu(static_cast<size_t>(S1));
    for (int64_t b = 0; b < B_; ++b) {
      const int64_t i = consumed_ + b;
      data_->row(i, x + b * T, y + b * T, pos.data(), cu.data());
      for (int64_t t = 0; vocab_ > 0 && t < T; ++t) {
        const int32_t tok = x[b * T + t], tgt = y[b * T + t];
        const bool bad_tok = tok < 0 || tok >= vocab_;
        if (bad_tok || (tgt != kIgnoreTarget && (tgt < 0 || tgt >= vocab_)))
          fail("{}: token id {} is outside the model's vocabulary [0, {}) (model.vocab_size)",
               data_->describe(i), bad_tok ? tok : tgt, vocab_);
      }
      if (positions.defined()) std::copy(pos.begin(), pos.end(), positions.data<int32_t>() + b * T);
      if (cu_seqlens.defined())
        std::copy(cu.begin(), cu.end(), cu_seqlens.data<int32_t>() + b * S1);
    }
    consumed_ += B_;
    return;
  }
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
