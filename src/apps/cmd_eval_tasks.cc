// `nekton eval tasks`: benchmark tasks in lm-evaluation-harness's YAML form
// (eval/) on a model folder, a GGUF file or a running OpenAI-compatible
// server, with the harness's prompts, metrics and result layout.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/commands.h"
#include "core/atomic_file.h"
#include "core/config_bind.h"
#include "core/log.h"
#include "data/chat/chat_config.h"
#include "data/chat/chat_template.h"
#include "eval/eval_model.h"
#include "eval/results.h"
#include "eval/server_eval_model.h"
#include "eval/task_runner.h"
#include "eval/task_suite.h"
#include "infer/model_source.h"

namespace nk {

namespace {

struct TaskKeys {
  std::string model, tasks, data, task_dir, tokenizer, dtype = "f32", output;
  std::string system_instruction, chat_template = "auto", prefix_text;
  bool apply_chat_template = false, fewshot_as_multiturn = false, share_prefixes = true;
  int64_t num_fewshot = -1, limit = 0, batch_size = 8, write_out = 0, bootstrap_iters = 100000;
  int64_t seed = 1234;
  double timeout_s = 600;
  Device device = kHost;

  void bind(ConfigBinder& b) {
    b.bind("eval.model", model,
           "saved model folder, FILE.gguf, or a server's http://HOST:PORT[/v1] (its "
           "/v1/completions with echo and logprobs)");
    b.bind("eval.tasks", tasks,
           "comma-separated tasks, groups (mmlu) or tags: names in eval.task_dir, or paths to "
           "task or group YAMLs");
    b.bind("eval.data", data,
           "folder of the tasks' documents: TASK/SPLIT.jsonl, or the "
           "task's dataset_kwargs.data_files relative to it");
    b.bind("eval.task_dir", task_dir,
           "folder of task YAMLs (default: the built-in configs/eval_tasks)");
    b.bind("eval.tokenizer", tokenizer, "tokenizer (default: the one saved with the model)");
    b.bind("eval.num_fewshot", num_fewshot, "few-shot examples per prompt (-1: each task's own)");
    b.bind("eval.limit", limit, "score only each task's first N documents (0: all)");
    b.bind("eval.batch_size", batch_size,
           "requests per forward (and sequences generated together)");
    b.bind("eval.share_prefixes", share_prefixes,
           "a model folder or GGUF: compute each context once for all its continuations (a "
           "question's choices) over the paged KV cache's prefix cache; false: every request's "
           "whole row");
    b.bind("eval.write_out", write_out,
           "print the prompts of each task's first N documents; with eval.output also write "
           "them (the harness's sample log) to OUTPUT.samples.jsonl");
    b.bind("eval.bootstrap_iters", bootstrap_iters,
           "resamples of the bootstrap standard errors (perplexity); 0: no standard errors");
    b.bind("eval.seed", seed,
           "seed of sampled answers (a task's generation_kwargs do_sample): answer j of "
           "document i draws with seed + i x repeats + j");
    b.bind("eval.system_instruction", system_instruction,
           "a system prompt before each context (with the task's description after "
           "fewshot_delimiter)");
    b.bind("eval.apply_chat_template", apply_chat_template,
           "render each context as a conversation with the model's chat template");
    b.bind("eval.chat_template", chat_template,
           "with eval.apply_chat_template: auto (the model's own), a built-in name or FILE.jinja");
    b.bind("eval.fewshot_as_multiturn", fewshot_as_multiturn,
           "with eval.apply_chat_template: each shot a user turn and an assistant answer");
    b.bind("eval.output", output, "write the results JSON (the harness's layout) to this file");
    b.bind("eval.dtype", dtype, "compute precision: f32 or bf16");
    b.bind("eval.timeout_s", timeout_s, "with a server URL: seconds each request may take");
    b.bind("eval.prefix_text", prefix_text,
           "with a server URL: the text of the model's end-of-text (or BOS) token, sent for an "
           "empty context (loglikelihood_rolling, acc_mutual_info)");
    b.bind_with<std::string>(
        "eval.device", device_name(device), "where the model runs: cpu, or cuda",
        [&](const std::string& s) { device = parse_device(s, "eval.device"); });
  }
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The model folder or GGUF file, and the chat template's part of `style`
// (with eval.apply_chat_template).
std::unique_ptr<EvalModel> load_local(const TaskKeys& k, const CommandArgs& a,
                                      RunnableModel& loaded, PromptStyle& style) {
  loaded = load_runnable_model({.prefix = "eval",
                                .model = k.model,
                                .tokenizer = k.tokenizer,
                                .dtype = k.dtype,
                                .quantize = "",
                                .adapter = "",
                                .allow_nonfinite = a.allow_nonfinite,
                                .device = k.device});
  if (k.apply_chat_template) {
    try {
      if (k.chat_template == "auto" && loaded.gguf) {
        if (loaded.gguf_chat_template.empty())
          fail("GGUF '{}' has no tokenizer.chat_template", k.model);
        style.chat = chat_template_from_jinja(loaded.gguf_chat_template,
                                              k.model + " tokenizer.chat_template");
      } else {
        style.chat = chat_template_for(k.chat_template, loaded.gguf ? "" : k.model);
      }
    } catch (const Error& e) {
      throw e.with_context("eval.chat_template");
    }
    if (!loaded.gguf) {
      style.specials = chat_specials(*loaded.tokenizer, k.model);
    } else {  // a GGUF's own: its end of text, and a BOS when it has one
      const Tokenizer& tok = *loaded.tokenizer;
      if (tok.eod_id() >= 0) style.specials.eos = tok.token_bytes(tok.eod_id());
      if (tok.bos_id() >= 0) style.specials.bos = tok.token_bytes(tok.bos_id());
    }
  }
  auto m = std::make_unique<LocalEvalModel>(*loaded.model, *loaded.tokenizer, k.batch_size,
                                            loaded.end_ids, k.apply_chat_template);
  m->set_share_prefixes(k.share_prefixes);
  return m;
}

}  // namespace

int eval_tasks(const CommandArgs& a) {
  ConfigSchema schema = schema_of([](ConfigBinder& b) { TaskKeys().bind(b); });
  if (a.help) {
    fmt::print(
        "usage: nekton eval tasks eval.model=DIR|FILE.gguf|URL eval.tasks=a,b eval.data=DIR "
        "[key=value ...]\n\n"
        "Benchmark tasks defined as lm-evaluation-harness defines them (YAML: doc_to_text,\n"
        "doc_to_target, doc_to_choice, output_type, metric_list, filter_list, ...), scored\n"
        "with the harness's prompts, few-shot draw (seed 1234), metrics and standard errors.\n\n{}",
        schema.help());
    return 0;
  }
  Config cfg = Config::load(schema, a.config_path, a.overrides);
  ConfigReader reader(cfg);
  TaskKeys k;
  k.bind(reader);
  if (k.model.empty()) fail("eval.model: no model given (eval.model=DIR, FILE.gguf or URL)");
  const bool server = k.model.find("://") != std::string::npos;
  if (server && k.apply_chat_template)
    fail(
        "eval.apply_chat_template: not with a server URL ('{}'): the chat template is the "
        "model folder's; evaluate the folder itself",
        k.model);
  if (!(k.timeout_s > 0)) fail("eval.timeout_s: must be > 0, got {}", k.timeout_s);
  if (k.tasks.empty()) fail("eval.tasks: no tasks given (eval.tasks=NAME[,NAME...])");
  if (k.data.empty()) fail("eval.data: no data folder given (eval.data=DIR)");
  if (k.limit < 0) fail("eval.limit: must be >= 0, got {}", k.limit);
  if (k.write_out < 0) fail("eval.write_out: must be >= 0, got {}", k.write_out);
  if (k.num_fewshot < -1) fail("eval.num_fewshot: must be >= -1, got {}", k.num_fewshot);
  if (k.bootstrap_iters < 0) fail("eval.bootstrap_iters: must be >= 0, got {}", k.bootstrap_iters);
  if (k.batch_size < 1) fail("eval.batch_size: must be >= 1, got {}", k.batch_size);
  if (k.fewshot_as_multiturn && !k.apply_chat_template)
    fail("eval.fewshot_as_multiturn: needs eval.apply_chat_template=true");
  // Every task and group file is read before the model: a bad one is told at once.
  const TaskSuite suite = load_suite(split_list(k.tasks), k.task_dir);

  std::unique_ptr<EvalModel> lm;
  RunnableModel loaded;
  PromptStyle style;
  style.system_instruction = k.system_instruction;
  style.multiturn = k.fewshot_as_multiturn;
  if (server) {
    lm = std::make_unique<ServerEvalModel>(k.model, k.batch_size,
                                           std::chrono::milliseconds(int64_t(k.timeout_s * 1000)),
                                           k.prefix_text);
  } else {
    lm = load_local(k, a, loaded, style);
  }
  const SuiteResult sr = run_suite(suite, *lm,
                                   {.data_dir = k.data,
                                    .num_fewshot = k.num_fewshot,
                                    .limit = k.limit,
                                    .write_out = k.write_out,
                                    .bootstrap_iters = k.bootstrap_iters,
                                    .style = style,
                                    .seed = uint64_t(k.seed)});
  const std::vector<TaskResult>& results = sr.tasks;
  for (const TaskResult& r : results)
    for (const auto& s : r.samples) {
      fmt::print(
          "Task: {}; document {}; context prompt (starting on next line):\n{}\n"
          "(end of prompt on previous line)\n",
          r.task, s["doc_id"].get<int64_t>(), s["arguments"][0][0].get<std::string>());
      fmt::print("target string or answer choice index (starting on next line):\n{}\n\n",
                 s["target"].is_string() ? s["target"].get<std::string>() : s["target"].dump());
    }
  fmt::print("{}", results_table(suite, results, sr.groups));
  if (!k.output.empty()) {
    nlohmann::ordered_json run = {{"model", "nekton"},
                                  {"model_args", k.model},
                                  {"batch_size", k.batch_size},
                                  {"limit", k.limit ? nlohmann::ordered_json(k.limit) : nullptr},
                                  {"bootstrap_iters", k.bootstrap_iters},
                                  {"system_instruction", k.system_instruction},
                                  {"apply_chat_template", k.apply_chat_template},
                                  {"fewshot_as_multiturn", k.fewshot_as_multiturn},
                                  {"fewshot_seed", 1234},
                                  {"seed", k.seed}};
    if (k.write_out > 0) {
      std::string samples;
      for (const TaskResult& r : results)
        for (nlohmann::ordered_json s : r.samples) {
          nlohmann::ordered_json line;
          line["task"] = r.task;
          for (auto it = s.begin(); it != s.end(); ++it) line[it.key()] = it.value();
          // Answers are bytes a model chose: one that is no UTF-8 is
          // written as U+FFFD, as Python decodes it with errors="replace".
          samples +=
              line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
        }
      write_file_atomic(k.output + ".samples.jsonl", samples);
    }
    write_file_atomic(k.output, results_json(suite, results, sr.groups, run).dump(2) + "\n");
  }
  return 0;
}

}  // namespace nk
