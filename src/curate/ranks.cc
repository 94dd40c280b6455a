#include "curate/ranks.h"

#include "core/tensor.h"
#include "dist/communicator.h"

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
  if (!comm_) return send;
  const int n = size();
  std::vector<int64_t> send_rows(static_cast<size_t>(n)), recv_rows(static_cast<size_t>(n));
  std::string flat;
  for (int j = 0; j < n; ++j) {
    send_rows[size_t(j)] = int64_t(send[size_t(j)].size());
    flat += send[size_t(j)];
  }
  comm_->all_to_all(Tensor::from_blob(send_rows.data(), {n}, DType::I64),
                    Tensor::from_blob(recv_rows.data(), {n}, DType::I64));
  int64_t total = 0;
  for (int64_t r : recv_rows) total += r;
  std::string in(size_t(total), '\0');
  // Empty buffers still need an address for the tensor.
  char dummy_in = 0, dummy_out = 0;
  comm_->all_to_allv(
      Tensor::from_blob(flat.empty() ? &dummy_in : flat.data(), {int64_t(flat.size())}, DType::U8),
      send_rows, Tensor::from_blob(in.empty() ? &dummy_out : in.data(), {total}, DType::U8),
      recv_rows);
  std::vector<std::string> out(static_cast<size_t>(n));
  size_t at = 0;
  for (int j = 0; j < n; ++j) {
    out[size_t(j)] = in.substr(at, size_t(recv_rows[size_t(j)]));
    at += size_t(recv_rows[size_t(j)]);
  }
  return out;
}

std::vector<std::string> Ranks::all_gather(const std::string& mine) const {
  return exchange(std::vector<std::string>(size_t(size()), mine));
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
