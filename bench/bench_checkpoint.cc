// Save and load speed of a full GPT-2 124M training checkpoint (f32 master
// weights + AdamW moments, ~1.5 GB) against the same disk's plain sequential
// write (+ fsync) and read (into new memory) of the same number of bytes, measured the same way
// in the same process, interleaved, best of N rounds.
//
// Page cache: dropping it system-wide needs root, so each file is evicted on
// its own with posix_fadvise(POSIX_FADV_DONTNEED) after it is fsynced (clean
// pages of a file can be dropped by anyone who can open it); mincore() then
// reports how much of it is still resident, and "cold" reads are printed with
// that figure. Warm reads (straight from the page cache) are printed too.
//
// Usage: bench_checkpoint [DIR (default: build/bench_ckpt)] [rounds (default 3)]
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "model/transformer.h"

namespace fs = std::filesystem;
using namespace nk;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(const std::function<void()>& f) {
  auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Drops the file's clean pages from the page cache; returns the fraction still resident.
double evict(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  NK_CHECK(fd >= 0, "open {}", path);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  size_t n = fs::file_size(path);
  double resident = 0;
  if (n > 0) {
    void* p = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      size_t page = size_t(::sysconf(_SC_PAGESIZE)), pages = (n + page - 1) / page, in = 0;
      std::vector<unsigned char> v(pages);
      if (::mincore(p, n, v.data()) == 0)
        for (unsigned char c : v) in += c & 1;
      resident = double(in) / double(pages);
      ::munmap(p, n);
    }
  }
  ::close(fd);
  return resident;
}

double evict_dir(const std::string& dir) {
  double worst = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) worst = std::max(worst, evict(e.path().string()));
  return worst;
}

// The baseline: `bytes` written sequentially in 64 MiB write() calls, then fsync.
void plain_write(const std::string& path, const std::vector<char>& chunk, size_t bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  NK_CHECK(fd >= 0, "open {}", path);
  for (size_t done = 0; done < bytes;) {
    size_t n = std::min(chunk.size(), bytes - done);
    ssize_t w = ::write(fd, chunk.data(), n);
    NK_CHECK(w > 0, "write {}", path);
    done += size_t(w);
  }
  NK_CHECK(::fsync(fd) == 0, "fsync {}", path);
  ::close(fd);
}

// The baseline read: the whole file into freshly allocated memory (as a load
// must: the checkpoint lands in new buffers, page faults included).
void plain_read(const std::string& path, size_t bytes) {
  std::unique_ptr<char[]> dst(new char[bytes]);
  int fd = ::open(path.c_str(), O_RDONLY);
  NK_CHECK(fd >= 0, "open {}", path);
  for (size_t done = 0; done < bytes;) {
    ssize_t n = ::read(fd, dst.get() + done, std::min<size_t>(bytes - done, size_t(64) << 20));
    NK_CHECK(n > 0, "read {}", path);
    done += size_t(n);
  }
  ::close(fd);
}

size_t dir_bytes(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "build/bench_ckpt";
  int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  set_log_level(LogLevel::Warn);
  fs::remove_all(dir);
  fs::create_directories(dir);

  ModelConfig cfg = model_preset("gpt2-124m");
  double t_init = 0;
  std::unique_ptr<Transformer> model;
  t_init = seconds([&] { model = std::make_unique<Transformer>(cfg, DType::F32, 1); });
  const ParamLayout& layout = model->layout();
  Tensor m = Tensor::empty({layout.total()}, DType::F32);
  Tensor v = Tensor::empty({layout.total()}, DType::F32);
  Rng rng(7);
  for (int64_t i = 0; i < layout.total(); ++i) {
    m.data<float>()[i] = float(rng.normal()) * 1e-3f;
    v.data<float>()[i] = float(rng.uniform()) * 1e-6f;
  }
  CheckpointContents c;
  c.step = 1;
  c.model = flat_tensors(layout, model->params(), "");
  c.optimizer = flat_tensors(layout, m, "exp_avg.");
  for (auto& t : flat_tensors(layout, v, "exp_avg_sq.")) c.optimizer.push_back(t);
  c.optimizer_metadata["optimizer"] = "adamw";
  c.text_files["trainer_state.json"] = "{}\n";
  c.text_files["config.yaml"] = "model:\n  preset: gpt2-124m\n";

  const std::string root = dir + "/checkpoints", plain = dir + "/plain.bin";
  std::string ck;
  std::vector<char> chunk(size_t(64) << 20, 1);
  double best_save = 1e30, best_write = 1e30, best_load = 1e30, best_read = 1e30;
  double best_verify = 1e30, best_load_warm = 1e30, best_read_warm = 1e30;
  double resident_ck = 0, resident_plain = 0;
  size_t bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    fs::remove_all(root);
    best_save = std::min(best_save, seconds([&] { ck = save_checkpoint(root, c, 1); }));
    bytes = dir_bytes(ck);
    best_write = std::min(best_write, seconds([&] { plain_write(plain, chunk, bytes); }));

    Tensor p2 = Tensor::empty({layout.total()}, DType::F32), m2 = p2, v2 = p2;
    auto load = [&] {
      CheckpointReader rd = CheckpointReader::open(ck);  // verifies every checksum
      p2 = Tensor::empty({layout.total()}, DType::F32);
      m2 = Tensor::empty({layout.total()}, DType::F32);
      v2 = Tensor::empty({layout.total()}, DType::F32);
      read_flat_tensors(rd.model(), layout, "", p2);
      read_flat_tensors(rd.optimizer(), layout, "exp_avg.", m2);
      read_flat_tensors(rd.optimizer(), layout, "exp_avg_sq.", v2);
    };
    resident_ck = std::max(resident_ck, evict_dir(ck));
    best_load = std::min(best_load, seconds(load));
    resident_plain = std::max(resident_plain, evict(plain));
    best_read = std::min(best_read, seconds([&] { plain_read(plain, bytes); }));
    best_load_warm = std::min(best_load_warm, seconds(load));
    best_read_warm = std::min(best_read_warm, seconds([&] { plain_read(plain, bytes); }));
    best_verify = std::min(best_verify, seconds([&] { CheckpointReader::open(ck); }));
    NK_CHECK(std::memcmp(v2.raw(), v.raw(), v.nbytes()) == 0, "loaded moments differ");
  }
  double mb = double(bytes) / 1e6;
  std::printf("GPT-2 124M full checkpoint: %.0f MB in %s (best of %d rounds)\n", mb, ck.c_str(),
              rounds);
  std::printf(
      "  save  %7.0f MB/s  (%.2f s)   plain write+fsync       %7.0f MB/s (%.2f s)   ratio %.2f\n",
      mb / best_save, best_save, mb / best_write, best_write, best_write / best_save);
  std::printf(
      "  load  %7.0f MB/s  (%.2f s)   plain read (new memory) %7.0f MB/s (%.2f s)   ratio %.2f   "
      "[cold: evicted, %.0f%% / %.0f%% still resident]\n",
      mb / best_load, best_load, mb / best_read, best_read, best_read / best_load,
      100 * resident_ck, 100 * resident_plain);
  std::printf(
      "  load  %7.0f MB/s  (%.2f s)   plain read (new memory) %7.0f MB/s (%.2f s)   ratio %.2f   "
      "[warm: page cache]\n",
      mb / best_load_warm, best_load_warm, mb / best_read_warm, best_read_warm,
      best_read_warm / best_load_warm);
  std::printf("  of which checksum verification (warm) %.2f s; a fresh model's init %.2f s\n",
              best_verify, t_init);
  fs::remove_all(dir);
  return 0;
}
