#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "ckpt/model_io.h"
#include "core/log.h"
#include "core/parallel.h"
#include "train/metrics.h"

namespace nk {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

double measure_gemm_peak(DType dtype) {
  const int64_t n = 2048;
  Tensor a = Tensor::zeros({n, n}, dtype), b = Tensor::zeros({n, n}, dtype);
  Tensor c = Tensor::empty({n, n}, dtype);
  ops::linear_forward(c, a, b, Tensor());  // warm-up: primitive creation
  double best = 1e30;
  for (int i = 0; i < 8; ++i) {
    auto t0 = Clock::now();
    ops::linear_forward(c, a, b, Tensor());
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * double(n) * double(n) * double(n) / best;
}

Trainer::Trainer(const TrainConfig& cfg) : cfg_(cfg) {
  if (cfg_.threads > 0) set_num_threads(int(cfg_.threads));
  corpus_ = TextCorpus::load(cfg_.data_path, cfg_.val_fraction, cfg_.max_bytes,
                             cfg_.replace_invalid_utf8);
  if (corpus_.replaced)
    NK_WARN("{}: replaced {} invalid UTF-8 sequences with U+FFFD", cfg_.data_path, corpus_.replaced);
  if (int64_t(corpus_.train.size()) < cfg_.seq_len + 1)
    fail("data.path: '{}' has {} training tokens, fewer than train.seq_len + 1 = {}",
         cfg_.data_path, corpus_.train.size(), cfg_.seq_len + 1);
  model_ = std::make_unique<Transformer>(cfg_.model, cfg_.dtype, cfg_.seed);
}

Trainer::~Trainer() = default;

double Trainer::evaluate() {
  if (int64_t(corpus_.val.size()) < cfg_.seq_len + 1) return NAN;
  Activations acts(cfg_.model, cfg_.dtype, cfg_.micro_batch, cfg_.seq_len, false);
  TokenLoader loader(&corpus_.val, cfg_.micro_batch, cfg_.seq_len, cfg_.seed + 1);
  Tensor tokens = Tensor::empty({cfg_.micro_batch, cfg_.seq_len}, DType::I32);
  Tensor targets = Tensor::empty({cfg_.micro_batch, cfg_.seq_len}, DType::I32);
  double sum = 0;
  for (int64_t i = 0; i < cfg_.val_batches; ++i) {
    loader.next(tokens, targets);
    sum += model_->forward_loss(acts, tokens, targets);
  }
  return sum / double(cfg_.val_batches);
}

void Trainer::run(const std::function<void(const StepStats&)>& on_step) {
  const int64_t B = cfg_.micro_batch, T = cfg_.seq_len, accum = cfg_.grad_accum();
  std::filesystem::create_directories(cfg_.out_dir);
  MetricsWriter metrics(cfg_.metrics_file);
  double peak = cfg_.peak_tflops > 0 ? cfg_.peak_tflops * 1e12 : measure_gemm_peak(cfg_.dtype);
  NK_INFO("model {}, {} layers: {:.2f}M parameters, {} compute, peak {:.0f} GFLOP/s{}",
          cfg_.model.arch, cfg_.model.n_layer, double(model_->layout().count()) / 1e6,
          dtype_name(cfg_.dtype), peak / 1e9, cfg_.peak_tflops > 0 ? "" : " (measured GEMM)");
  NK_INFO(
      "data {}: {} train / {} val tokens; {} x {} tokens per micro-batch, {} micro-batches "
      "per step",
      cfg_.data_path, corpus_.train.size(), corpus_.val.size(), B, T, accum);

  Activations acts(cfg_.model, cfg_.dtype, B, T, true);
  AdamW opt(*model_, cfg_.adamw);
  TokenLoader loader(&corpus_.train, B, T, cfg_.seed);
  Tensor tokens = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
  const double flops_per_step = cfg_.model.train_flops(B * T * accum, T);
  auto t_start = Clock::now();

  for (int64_t step = 0; step < cfg_.steps; ++step) {
    auto t0 = Clock::now();
    model_->zero_grads();
    double loss = 0;
    for (int64_t m = 0; m < accum; ++m) {
      loader.next(tokens, targets);
      loss += model_->forward_backward(acts, tokens, targets, 1.f / float(accum)) / double(accum);
    }
    double norm = std::sqrt(ops::sum_squares(model_->grads()));
    if (!std::isfinite(loss) || !std::isfinite(norm))
      fail("step {}: non-finite {} ({}); stopping without saving", step + 1,
           std::isfinite(loss) ? "gradient norm" : "loss", std::isfinite(loss) ? norm : loss);
    float clip = cfg_.grad_clip > 0 && norm > cfg_.grad_clip ? float(cfg_.grad_clip / norm) : 1.f;
    double lr = cfg_.lr.at(step);
    opt.step(lr, clip);

    StepStats s;
    s.step = step + 1;
    s.loss = loss;
    s.lr = lr;
    s.grad_norm = norm;
    double dt = seconds_since(t0);
    s.step_ms = dt * 1e3;
    s.tokens_per_s = double(B * T * accum) / dt;
    s.mfu = flops_per_step / dt / peak;
    s.peak_bytes = Allocator::get(Device::CPU).peak_bytes();
    if (cfg_.val_every > 0 && (s.step % cfg_.val_every == 0 || s.step == cfg_.steps))
      s.val_loss = evaluate();
    history_.push_back(s);

    if (s.step % cfg_.log_every == 0 || s.step == cfg_.steps || !std::isnan(s.val_loss)) {
      double elapsed = seconds_since(t_start);
      double eta = elapsed / double(s.step) * double(cfg_.steps - s.step);
      std::string val = std::isnan(s.val_loss) ? "" : fmt::format(" | val {:.4f}", s.val_loss);
      fmt::print(
          "step {:>5}/{} | loss {:.4f}{} | lr {:.2e} | gnorm {:.3f} | {:.0f} tok/s | "
          "MFU {:.1f}% | {:.0f} ms | mem {:.0f} MiB | eta {:.0f}s\n",
          s.step, cfg_.steps, s.loss, val, s.lr, s.grad_norm, s.tokens_per_s, 100 * s.mfu,
          s.step_ms, double(s.peak_bytes) / 1048576.0, eta);
      std::fflush(stdout);
    }
    metrics.write({{"step", double(s.step)},
                   {"loss", s.loss},
                   {"val_loss", s.val_loss},
                   {"lr", s.lr},
                   {"grad_norm", s.grad_norm},
                   {"tokens_per_s", s.tokens_per_s},
                   {"mfu", s.mfu},
                   {"step_ms", s.step_ms},
                   {"peak_mem_bytes", double(s.peak_bytes)},
                   {"peak_rss_bytes", double(peak_rss_bytes())}});
    if (on_step) on_step(s);
  }
  std::string model_dir = cfg_.out_dir + "/model";
  save_model(model_dir, *model_);
  NK_INFO("saved {}", model_dir);
}

}  // namespace nk
