#include "apps/train_eval_tasks.h"

#include <chrono>
#include <memory>
#include <sstream>

#include "core/log.h"
#include "data/tokenizer/tokenizer.h"
#include "eval/eval_model.h"
#include "eval/task_suite.h"

namespace nk {

void attach_eval_tasks(Trainer& trainer, const TrainConfig& cfg) {
  const TrainEvalTasks& e = cfg.eval;
  if (e.tasks.empty()) return;
  std::vector<std::string> names;
  std::stringstream ss(e.tasks);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) names.push_back(item);
  auto suite = std::make_shared<TaskSuite>(load_suite(names, e.task_dir, "train.eval_tasks"));
  const std::string spec = !e.tokenizer.empty()          ? e.tokenizer
                           : !cfg.data.tokenizer.empty() ? cfg.data.tokenizer
                                                         : "bytes";
  std::shared_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(spec);
  } catch (const Error& err) {
    throw err.with_context("train.eval_tokenizer");
  }
  if (tok->vocab_size() > cfg.model.vocab_size)
    fail("train.eval_tokenizer: '{}' has {} tokens, more than the model's {} (model.vocab_size)",
         spec, tok->vocab_size(), cfg.model.vocab_size);
  const TaskRunOptions opt{.data_dir = e.data,
                           .num_fewshot = e.num_fewshot,
                           .limit = e.limit,
                           .write_out = 0,
                           .bootstrap_iters = 100000,
                           .style = {}};
  const int64_t batch = e.batch_size;
  trainer.set_step_evaluator([suite, tok, opt, batch, &trainer](int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> end_ids;
    if (tok->eod_id() >= 0) end_ids.push_back(tok->eod_id());
    LocalEvalModel lm(trainer.model(), *tok, batch, end_ids);
    const SuiteResult r = run_suite(*suite, lm, opt);
    NK_INFO("eval tasks at step {}: {} tasks in {:.1f} s", step, r.tasks.size(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return suite_figures(*suite, r);
  });
}

}  // namespace nk
