// One task evaluated as lm-evaluation-harness evaluates it: the scored
// split's documents in order, each with its few-shot context, turned into
// requests (multiple_choice: (context, target_delimiter + choice) per
// choice; loglikelihood: (context, target); loglikelihood_rolling: the
// target text; generate_until: context with until and max_gen_toks,
// `repeats` answers, greedy or sampled), the model's answers through each
// filter (which leaves one) into per-document metric values, and
// those aggregated with their standard errors.
//
// Per document (process_results): acc = argmax of the choices'
// log-likelihoods is the gold index (any of a list of golds); acc_norm the
// same of loglik / len(choice) in code points, acc_bytes in UTF-8 bytes,
// acc_mutual_info of loglik less the choice's loglik after an empty context;
// perplexity = loglik and acc = greedy for loglikelihood; (loglik, words)
// and (loglik, bytes) for the rolling metrics; exact_match of the filtered
// answer against the target (its choice when the task has choices).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/eval_model.h"
#include "eval/task_config.h"
#include "eval/task_prompt.h"

namespace nk {

struct TaskRunOptions {
  std::string data_dir;
  int64_t num_fewshot = -1;  // -1: the task's own
  int64_t limit = 0;         // score only the first N documents (0: all)
  int64_t write_out = 0;     // keep the requests of the first N documents
  // Resamples of the bootstrap standard errors (perplexity); 0: no standard
  // errors at all, as the harness has it.
  int64_t bootstrap_iters = 100000;
  PromptStyle style;  // system instruction, chat template
  // Sampled answers (generation_kwargs' do_sample): answer j of document i
  // draws with seed + i x repeats + j.
  uint64_t seed = 1234;
};

struct MetricValue {
  std::string key;  // "acc,none"
  double value = 0;
  std::optional<double> stderr_;  // none: "N/A"
  bool higher_is_better = true;
};

struct TaskResult {
  std::string task;
  int64_t num_fewshot = 0;
  int64_t n_docs = 0;                // scored (eval.limit)
  int64_t n_total = 0;               // in the split
  std::vector<MetricValue> metrics;  // in metric_list order, then filter order
  // Per written-out document: doc_id, doc, target, arguments, resps,
  // filtered_resps (the harness's sample log).
  std::vector<nlohmann::ordered_json> samples;
};

// nk::Error naming the task file, the data file, the document index and the
// field for a document the templates cannot turn into requests (a missing
// field, a choice index out of range, a target that is not a choice).
TaskResult run_task(const TaskConfig& c, EvalModel& model, const TaskRunOptions& opt);

}  // namespace nk
