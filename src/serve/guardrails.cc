#include "serve/guardrails.h"

#include <fmt/format.h>

#include "serve/engine.h"
#include "serve/serve_context.h"

namespace nk {

Guardrails::Guardrails(GuardrailsConfig c) : cfg_(std::move(c)), input_(cfg_), output_(cfg_) {}

std::vector<std::string> Guardrails::input_texts(const CompletionRequest& r,
                                                 const Tokenizer& tok) const {
  std::vector<std::string> out;
  if (r.kind == ApiKind::Completion) {
    for (const PromptInput& p : r.prompts) out.push_back(p.is_ids ? tok.decode(p.ids) : p.text);
    return out;
  }
  const std::string& which = cfg_.input.messages;
  if (which == "last_user") {
    for (auto it = r.messages.rbegin(); it != r.messages.rend(); ++it)
      if (it->role == "user") return {it->content};
    return out;
  }
  for (const ChatMessage& m : r.messages)
    if (which == "all" || m.role == "user") out.push_back(m.content);
  return out;
}

InputVerdict Guardrails::check_input(const ServeContext& ctx, const CompletionRequest& r) const {
  if (input_.empty()) return {};
  PerplexityFn ppl;
  if (input_.needs_perplexity()) ppl = engine_perplexity(ctx.engine, ctx.tok);
  return input_.check(input_texts(r, ctx.tok), ctx.tok, ppl, &ctx.metrics);
}

void Guardrails::count_output(const OutputFilter& f, ServeMetrics& m) const {
  for (int rail = 0; rail < OutputRails::kRails; ++rail) {
    if (!output_.on(rail)) continue;
    const MetricLabels labels{{"rail", OutputRails::name(rail)}};
    m.guardrail_checks.inc(1, labels);
    if ((f.triggered() >> unsigned(rail)) & 1u) m.guardrail_triggered.inc(1, labels);
  }
}

std::string Guardrails::describe() const {
  std::vector<std::string> out;
  for (int rail = 0; rail < OutputRails::kRails; ++rail)
    if (output_.on(rail)) out.emplace_back(OutputRails::name(rail));
  const std::vector<std::string> in = input_.names();
  return fmt::format("input rails: {}; output rails: {}",
                     in.empty() ? "none" : fmt::format("{}", fmt::join(in, ", ")),
                     out.empty() ? "none" : fmt::format("{}", fmt::join(out, ", ")));
}

std::unique_ptr<Guardrails> load_guardrails(const std::string& path) {
  if (path.empty()) return nullptr;
  return std::make_unique<Guardrails>(read_guardrails_config(path));
}

PerplexityFn engine_perplexity(Engine& engine, const Tokenizer& tok) {
  return [&engine, &tok](std::string_view text) -> std::optional<double> {
    std::vector<int32_t> ids;
    tok.encode(text, ids);
    if (ids.size() < 2) return std::nullopt;
    double ppl = 0;
    // The HTTP thread waits for the job, so the references stay valid.
    engine
        .run_job([&](Transformer& model) {
          ppl = evaluate_perplexity(model, ids, jailbreak_perplexity_options(model.config()))
                    .perplexity;
        })
        .get();
    return ppl;
  };
}

}  // namespace nk
