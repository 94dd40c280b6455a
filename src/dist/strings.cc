#include "dist/strings.h"

namespace nk::dist {

namespace {
// A U8 tensor over s's bytes (an empty string's data() is its own
// terminator: an address, distinct from every other string's).
Tensor bytes_of(std::string& s) {
  return Tensor::from_blob(s.data(), {int64_t(s.size())}, DType::U8);
}

std::vector<std::string> split(const std::string& flat, const std::vector<int64_t>& sizes) {
  std::vector<std::string> out;
  size_t at = 0;
  for (int64_t n : sizes) {
    out.push_back(flat.substr(at, size_t(n)));
    at += size_t(n);
  }
  return out;
}
}  // namespace

std::vector<std::string> exchange_strings(Communicator& comm,
                                          const std::vector<std::string>& send) {
  const int n = comm.size();
  NK_CHECK(int(send.size()) == n, "exchange_strings: {} strings for a group of {}", send.size(), n);
  std::vector<int64_t> send_rows(static_cast<size_t>(n)), recv_rows(static_cast<size_t>(n));
  std::string flat;
  for (int j = 0; j < n; ++j) {
    send_rows[size_t(j)] = int64_t(send[size_t(j)].size());
    flat += send[size_t(j)];
  }
  comm.all_to_all(Tensor::from_blob(send_rows.data(), {n}, DType::I64),
                  Tensor::from_blob(recv_rows.data(), {n}, DType::I64));
  int64_t total = 0;
  for (int64_t r : recv_rows) total += r;
  std::string in(size_t(total), '\0');
  comm.all_to_allv(bytes_of(flat), send_rows, bytes_of(in), recv_rows);
  return split(in, recv_rows);
}

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  std::vector<int64_t> sizes(static_cast<size_t>(n));
  int64_t size = int64_t(mine.size());
  comm.all_gather(Tensor::from_blob(&size, {1}, DType::I64),
                  Tensor::from_blob(sizes.data(), {n}, DType::I64));
  int64_t total = 0, at = 0;
  for (int j = 0; j < n; ++j) {
    if (j == comm.rank()) at = total;
    total += sizes[size_t(j)];
  }
  std::string all(size_t(total), '\0');
  all.replace(size_t(at), mine.size(), mine);
  comm.all_gather_v(bytes_of(all), sizes);
  return split(all, sizes);
}

}  // namespace nk::dist
