#include "serve/completion_route.h"

#include <atomic>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>

#include "data/chat/sft_data.h"
#include "serve/guardrails.h"
#include "serve/openai_response.h"
#include "serve/sse.h"

namespace nk {

using json = nlohmann::json;

namespace {

// A stream with nothing to say for this long writes an SSE comment line
// (which clients skip), to find out whether its client is still there.
constexpr auto kKeepAliveAfter = std::chrono::seconds(2);
// Most sequences (prompts x n) one request may submit.
constexpr int64_t kMaxSequences = 1024;
// OpenAI's finish_reason for an answer its content filter stopped.
constexpr const char* kContentFilter = "content_filter";

uint64_t random_u64() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lock(mu);
  return rng();
}

ResponseHead response_head(const ServeContext& ctx, ApiKind kind) {
  static std::atomic<uint64_t> serial{0};
  return {fmt::format("{}-{:012x}{:06x}", kind == ApiKind::Chat ? "chatcmpl" : "cmpl",
                      random_u64() & 0xffffffffffffULL, serial++ & 0xffffff),
          int64_t(std::time(nullptr)), ctx.model_name};
}

// Folds one event into its choice.
void fold(ChoiceOutput& c, const StreamEvent& e, bool logprobs) {
  ++c.sampled;
  c.text += e.piece;
  const bool eod = e.finished && e.finish == FinishReason::Eos;
  if (!eod) {
    c.tokens.push_back(e.token);
    if (logprobs) {
      c.logprobs.push_back(e.logprob);
      c.top.push_back(e.top);
    }
  }
  if (e.finished) {
    c.finished = true;
    c.finish = e.finish;
  }
}

int64_t completion_tokens(const std::vector<ChoiceOutput>& choices) {
  int64_t n = 0;
  for (const ChoiceOutput& c : choices) n += c.sampled;
  return n;
}

// A streamed response: the events folded so far and what has been written.
struct StreamState {
  const ServeContext* ctx;
  PreparedCompletion p;
  ResponseHead head;
  std::shared_ptr<RequestChannel> channel;
  std::vector<ChoiceOutput> choices;
  std::vector<size_t> sent_tokens, sent_bytes;  // per choice: logprobs written so far
  std::vector<OutputFilter> filters;            // per choice, with output guardrails
  std::vector<char> ended;                      // per choice: finished or refused
  int64_t open = 0;                             // choices not finished
  bool started = false, over = false, gone = false;
  ServeClock::time_point last_write;
  std::shared_ptr<RequestTally> tally;
  std::shared_ptr<void> hold;  // released with the stream
};

// The chunks one event adds to the stream.
std::string chunks_for(StreamState& s, const StreamEvent& e) {
  const bool chat = s.p.req.kind == ApiKind::Chat, usage = s.p.req.include_usage;
  const bool logprobs = s.p.req.logprobs;
  if (s.ended[size_t(e.choice)]) return {};  // refused by an output rail: the rest is dropped
  ChoiceOutput& c = s.choices[size_t(e.choice)];
  const size_t before = c.tokens.size();
  fold(c, e, logprobs);
  const bool new_token = c.tokens.size() > before;
  std::string out;
  json lp = nullptr;
  if (logprobs && new_token) {
    size_t& tokens = s.sent_tokens[size_t(e.choice)];
    size_t& bytes = s.sent_bytes[size_t(e.choice)];
    if (chat) {
      lp = {{"content", chat_logprob_entries(s.ctx->tok, c, tokens, c.tokens.size())},
            {"refusal", nullptr}};
    } else {
      lp = completion_logprobs(s.ctx->tok, c, tokens, c.tokens.size(), bytes);
    }
    for (; tokens < c.tokens.size(); ++tokens)
      bytes += s.ctx->tok.token_bytes(c.tokens[tokens]).size();
  }
  const char* finish = e.finished ? openai_finish_reason(e.finish) : nullptr;
  std::string piece(e.piece);
  bool ends = e.finished;
  if (!s.filters.empty()) {
    // Output rails: the text goes out as the filter releases it.
    OutputFilter& f = s.filters[size_t(e.choice)];
    piece = f.push(e.piece);
    if (e.finished) piece += f.finish();
    if (f.refused()) {
      piece += s.ctx->guardrails->refusal();
      finish = kContentFilter;
      if (!e.finished) s.ctx->engine.cancel(s.channel, e.choice);
      ends = true;
    }
    if (ends) s.ctx->guardrails->count_output(f, s.ctx->metrics);
  }
  if (chat) {
    if (!piece.empty() || !lp.is_null())
      out += sse_event(chat_chunk(s.head, e.choice, {{"content", piece}}, lp, nullptr, usage));
    if (finish)
      out += sse_event(chat_chunk(s.head, e.choice, json::object(), nullptr, finish, usage));
  } else if (!piece.empty() || !lp.is_null() || finish) {
    out += sse_event(completion_chunk(s.head, e.choice, piece, lp, finish, usage));
  }
  if (ends) {
    s.ended[size_t(e.choice)] = 1;
    --s.open;
  }
  return out;
}

// The first bytes of a stream: chat's role delta for every choice,
// completions' echoed prompts.
std::string stream_start(StreamState& s) {
  std::string out;
  const bool usage = s.p.req.include_usage;
  for (size_t i = 0; i < s.choices.size(); ++i) {
    if (s.p.req.kind == ApiKind::Chat)
      out += sse_event(chat_chunk(s.head, int64_t(i), {{"role", "assistant"}, {"content", ""}},
                                  nullptr, nullptr, usage));
    else if (!s.p.prefix[i].empty())
      out +=
          sse_event(completion_chunk(s.head, int64_t(i), s.p.prefix[i], nullptr, nullptr, usage));
  }
  return out;
}

void client_gone(StreamState& s) {
  if (s.gone || s.open == 0) return;
  s.gone = true;
  s.tally->completion_tokens = completion_tokens(s.choices);
  s.ctx->engine.cancel(*s.channel);
  s.ctx->metrics.disconnects.inc();
}

// Moves every event the channel holds to `out`, never waiting; the
// request's error when the engine failed it (after the events before it).
std::optional<ApiError> take_events(RequestChannel& ch, std::vector<StreamEvent>& out) {
  try {
    for (size_t before = out.size() + 1; out.size() != before;) {
      before = out.size();
      ch.wait(out, std::chrono::milliseconds(0));
    }
  } catch (const ApiError& e) {
    return e;
  }
  return std::nullopt;
}

// A streamed answer: the head at once, then the chunks of the events as the
// engine sends them, then [DONE] (or an error event).
class StreamAnswer : public ResponseSource {
 public:
  explicit StreamAnswer(std::shared_ptr<StreamState> s) : s_(std::move(s)) {}
  ~StreamAnswer() override { s_->channel->on_ready(nullptr); }

  void start(std::function<void()> wake) override { s_->channel->on_ready(std::move(wake)); }

  bool poll(ResponseWriter& w) override {
    StreamState& s = *s_;
    std::string out;
    if (!s.started) {
      s.started = true;
      HttpResponse head;
      head.content_type = "text/event-stream";
      head.headers.emplace_back("Cache-Control", "no-cache");
      w.start_stream(std::move(head));
      out = stream_start(s);
    }
    std::vector<StreamEvent> events;
    const std::optional<ApiError> failed = take_events(*s.channel, events);
    try {
      for (const StreamEvent& e : events) out += chunks_for(s, e);
      if (failed) throw *failed;
      if (s.open == 0) {
        const int64_t done = completion_tokens(s.choices);
        s.tally->completion_tokens = done;
        if (s.p.req.include_usage)
          out += sse_event(usage_chunk(s.head, s.p.req.kind == ApiKind::Chat,
                                       usage_json(s.p.prompt_tokens, done)));
        out += sse_done();
        s.over = true;
      }
    } catch (const ApiError& e) {
      // Mid-stream the status is sent already: the error goes as an event,
      // which OpenAI's clients raise as an APIError.
      out += sse_event(e.to_json()) + sse_done();
      s.tally->completion_tokens = completion_tokens(s.choices);
      s.over = true;
      s.open = 0;
    }
    const ServeClock::time_point now = ServeClock::now();
    if (out.empty() && now - s.last_write >= kKeepAliveAfter) out = sse_keepalive();
    if (!out.empty()) {
      w.write(std::move(out));
      s.last_write = now;
    }
    if (s.over) {
      s.channel->on_ready(nullptr);
      w.end();
    }
    return s.over;
  }

  // The connection ended first (the client went away, or did not read).
  void abandon() override {
    s_->channel->on_ready(nullptr);
    if (!s_->over) client_gone(*s_);
  }

 private:
  std::shared_ptr<StreamState> s_;
};

// The rails' output filters of a request's choices (none without output rails).
std::vector<OutputFilter> output_filters(const ServeContext& ctx, size_t n) {
  if (!ctx.guardrails || ctx.guardrails->output().empty()) return {};
  return std::vector<OutputFilter>(n, OutputFilter(ctx.guardrails->output()));
}

// A request an input rail refused: every choice is the refusal with
// finish_reason content_filter (the model does not run), or a 400 with
// on_input: error.
HttpResponse answer_refusal(const ServeContext& ctx, const PreparedCompletion& p) {
  const Guardrails& g = *ctx.guardrails;
  const bool chat = p.req.kind == ApiKind::Chat;
  if (g.input_error())
    throw ApiError(400, "The request was refused by the server's guardrails.",
                   chat ? "messages" : "prompt", kContentFilter);
  const size_t n = p.prefix.size();  // a choice each
  const ResponseHead head = response_head(ctx, p.req.kind);
  const json usage = usage_json(p.prompt_tokens, 0);
  if (!p.req.stream) {
    std::vector<ChoiceOutput> choices(n);
    for (ChoiceOutput& c : choices) {
      c.text = g.refusal();
      c.finished = true;
    }
    json body = chat ? chat_completion(head, ctx.tok, choices, p.req.logprobs, usage)
                     : text_completion(head, ctx.tok, choices, p.req.logprobs, p.prefix, usage);
    for (json& c : body["choices"]) c["finish_reason"] = kContentFilter;
    HttpResponse r;
    r.body = dump_json(body);
    return r;
  }
  const bool with_usage = p.req.include_usage;
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const int64_t k = int64_t(i);
    if (chat) {
      out += sse_event(chat_chunk(head, k, {{"role", "assistant"}, {"content", ""}}, nullptr,
                                  nullptr, with_usage));
      out +=
          sse_event(chat_chunk(head, k, {{"content", g.refusal()}}, nullptr, nullptr, with_usage));
      out += sse_event(chat_chunk(head, k, json::object(), nullptr, kContentFilter, with_usage));
    } else {
      out += sse_event(completion_chunk(head, k, p.prefix[i] + g.refusal(), nullptr, kContentFilter,
                                        with_usage));
    }
  }
  if (with_usage) out += sse_event(usage_chunk(head, chat, usage));
  out += sse_done();
  HttpResponse r;
  r.content_type = "text/event-stream";
  r.headers.emplace_back("Cache-Control", "no-cache");
  r.body = std::move(out);
  return r;
}

// prompt_logprobs of each prompt (scored once when repeated for n > 1), by
// one forward each on the engine's thread.
std::vector<json> score_prompts(const ServeContext& ctx,
                                const std::vector<std::vector<int32_t>>& prompts, int64_t top) {
  const int64_t vocab = std::min(ctx.model.config().vocab_size, ctx.tok.vocab_size());
  std::vector<json> out(prompts.size());
  ctx.engine
      .run_job([&](Transformer& model) {
        for (size_t i = 0; i < prompts.size(); ++i) {
          if (i > 0 && prompts[i] == prompts[i - 1]) {
            out[i] = out[i - 1];
            continue;
          }
          std::vector<ScoredToken> scored;
          if (prompts[i].size() >= 2)
            scored = token_logprobs(model, prompts[i], {}, top, {}, vocab);
          out[i] = prompt_logprobs(ctx.tok, prompts[i], scored);
        }
      })
      .get();
  return out;
}

// A whole (non-streamed) answer: the events folded as they come, the JSON
// sent once every choice has ended.
class WholeAnswer : public ResponseSource {
 public:
  WholeAnswer(const ServeContext& ctx, PreparedCompletion p, std::shared_ptr<RequestChannel> ch,
              std::shared_ptr<RequestTally> tally, std::shared_ptr<void> hold)
      : ctx_(ctx),
        p_(std::move(p)),
        channel_(std::move(ch)),
        tally_(std::move(tally)),
        hold_(std::move(hold)),
        choices_(channel_->sequences()),
        early_(output_filters(ctx, choices_.size())),
        ended_(choices_.size(), 0),
        open_(choices_.size()) {}
  ~WholeAnswer() override { channel_->on_ready(nullptr); }

  void start(std::function<void()> wake) override { channel_->on_ready(std::move(wake)); }

  bool poll(ResponseWriter& w) override {
    std::vector<StreamEvent> events;
    const std::optional<ApiError> failed = take_events(*channel_, events);
    for (const StreamEvent& e : events) fold_event(e);
    if (failed) {
      channel_->on_ready(nullptr);
      w.send(failed->response());
      return true;
    }
    if (open_ > 0) return false;
    channel_->on_ready(nullptr);
    w.send(finish());
    return true;
  }

  // The connection closed before the answer was ready (the server stops):
  // its sequences end.
  void abandon() override {
    channel_->on_ready(nullptr);
    if (open_ > 0) ctx_.engine.cancel(*channel_);
  }

 private:
  void fold_event(const StreamEvent& e) {
    const size_t i = size_t(e.choice);
    if (ended_[i]) return;
    fold(choices_[i], e, p_.req.logprobs);
    bool ends = e.finished;
    // With output rails, a filter per choice sees the answer as it comes
    // only to stop a refused one early; the whole answer is checked at the
    // end.
    if (!early_.empty()) {
      early_[i].push(e.piece);
      if (early_[i].refused() && !ends) {
        ctx_.engine.cancel(channel_, e.choice);
        ends = true;
      }
    }
    if (ends) {
      ended_[i] = 1;
      --open_;
    }
  }

  HttpResponse finish() {
    const size_t n = choices_.size();
    std::vector<char> refused(n, 0);
    for (size_t i = 0; i < early_.size(); ++i) {
      OutputFilter whole(ctx_.guardrails->output());
      std::string text = whole.whole(choices_[i].text);
      const OutputFilter& seen = early_[i].refused() ? early_[i] : whole;
      refused[i] = seen.refused();
      choices_[i].text = refused[i] ? ctx_.guardrails->refusal() : std::move(text);
      ctx_.guardrails->count_output(seen, ctx_.metrics);
    }
    const ResponseHead head = response_head(ctx_, p_.req.kind);
    const json usage = usage_json(p_.prompt_tokens, completion_tokens(choices_));
    tally_->completion_tokens = completion_tokens(choices_);
    json body = p_.req.kind == ApiKind::Chat
                    ? chat_completion(head, ctx_.tok, choices_, p_.req.logprobs, usage)
                    : text_completion(head, ctx_.tok, choices_, p_.req.logprobs, p_.prefix, usage,
                                      p_.echoed);
    for (size_t i = 0; i < n; ++i)
      if (refused[i]) body["choices"][i]["finish_reason"] = kContentFilter;
    HttpResponse r;
    r.body = dump_json(body);
    return r;
  }

  const ServeContext& ctx_;
  PreparedCompletion p_;
  std::shared_ptr<RequestChannel> channel_;
  std::shared_ptr<RequestTally> tally_;
  std::shared_ptr<void> hold_;  // released with the answer
  std::vector<ChoiceOutput> choices_;
  std::vector<OutputFilter> early_;
  std::vector<char> ended_;  // per choice: finished, or refused early
  size_t open_;              // choices not ended
};

}  // namespace

void check_model(const ServeContext& ctx, const std::string& model) {
  if (!model.empty() && model != ctx.model_name)
    throw ApiError(404,
                   fmt::format("The model `{}` does not exist (this server serves `{}`).", model,
                               ctx.model_name),
                   "model", "model_not_found");
}

std::vector<int32_t> chat_prompt_ids(const ServeContext& ctx,
                                     const std::vector<ChatMessage>& messages,
                                     const ChatPromptEnd& end,
                                     const nlohmann::ordered_json& tools) {
  if (!ctx.chat_template) throw ApiError(400, ctx.no_template, "messages");
  std::vector<ChatSegment> segments;
  try {
    std::string text =
        ctx.chat_template->text(messages, ctx.specials, end.add_generation_prompt, tools);
    if (end.continue_final_message) text = continue_final_message(text, messages);
    segments = {{std::move(text), false}};
  } catch (const Error& e) {
    throw ApiError(400,
                   fmt::format("The chat template ({}) refuses these messages: {}",
                               ctx.chat_template->name(), e.what()),
                   "messages");
  }
  return tokenize_chat(segments, ctx.tok, LossOn::All).tokens;
}

PreparedCompletion prepare_completion(const ServeContext& ctx, std::string_view body,
                                      ApiKind kind) {
  PreparedCompletion p;
  p.req = parse_completion_request(body, kind);
  const CompletionRequest& r = p.req;
  check_model(ctx, r.model);
  const int64_t vocab = std::min(ctx.model.config().vocab_size, ctx.tok.vocab_size());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> texts;  // for echo
  const char* field = kind == ApiKind::Chat ? "messages" : "prompt";
  // SteerLM: the label string, written as align.method=steerlm wrote its data.
  std::optional<SteerLmSpec> steer;
  std::string label;
  if (!r.steerlm_attributes.empty()) {
    try {
      steer = ctx.steerlm ? *ctx.steerlm
                          : steerlm_spec_for("", r.steerlm_attributes, "", "steerlm_attributes");
      std::vector<int64_t> v;
      for (const auto& x :
           parse_attribute_string(*steer, r.steerlm_attributes, "steerlm_attributes"))
        v.push_back(*x);
      label = attribute_string(*steer, v);
    } catch (const Error& e) {
      bad_param("steerlm_attributes", "{}", e.what());
    }
  }
  if (kind == ApiKind::Chat) {
    prompts.push_back(
        chat_prompt_ids(ctx, steer ? steerlm_messages(*steer, label, r.messages) : r.messages,
                        r.chat_end, r.tools));
    texts.emplace_back();
  } else {
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      const PromptInput& in = r.prompts[i];
      std::vector<int32_t> ids = in.ids;
      if (in.is_ids && steer)
        bad_param("steerlm_attributes", "prompt {} is token ids; SteerLM conditions text prompts",
                  i);
      if (in.is_ids) {
        for (int32_t id : ids)
          if (id >= vocab)
            bad_param("prompt", "prompt {}: token {} is outside the vocabulary ({} tokens)", i, id,
                      vocab);
      } else {
        const std::string text =
            steer ? steerlm_prompt(*steer, label, in.text, "prompt").get<std::string>() : in.text;
        ctx.tok.encode_with_specials(text, ids);
      }
      if (ids.empty()) bad_param("prompt", "prompt {} encodes to no tokens", i);
      texts.push_back(in.is_ids ? ctx.tok.decode(ids) : in.text);
      prompts.push_back(std::move(ids));
    }
  }
  if (int64_t(prompts.size()) * r.n > kMaxSequences)
    bad_param("n", "{} prompts x n = {} asks for {} sequences; at most {} per request",
              prompts.size(), r.n, int64_t(prompts.size()) * r.n, kMaxSequences);
  // p-tuning's virtual tokens take positions before the prompt.
  const int64_t virt = ctx.model.config().prompt.virtual_tokens;
  for (const auto& ids : prompts) {
    const int64_t n = int64_t(ids.size()) + virt;
    // A prompt scored alone (max_tokens 0) may fill the context.
    if (r.prompt_only ? n > ctx.max_len : n >= ctx.max_len)
      bad_param(field,
                "This model's maximum context length is {} tokens. However, your {} has {} "
                "tokens, which leaves no room for a completion. Please shorten it.",
                ctx.max_len, field, n);
    if (r.max_tokens > 0 && n + r.max_tokens > ctx.max_len)
      bad_param(r.max_tokens_param,
                "This model's maximum context length is {} tokens. However, you requested {} "
                "tokens ({} in the {}, {} for the completion). Please reduce the length of the "
                "{} or the completion ({}).",
                ctx.max_len, n + r.max_tokens, n, field, r.max_tokens, field, r.max_tokens_param);
    p.prompt_tokens += int64_t(ids.size());
  }
  if (r.logprobs && ctx.guardrails && !ctx.guardrails->output().empty())
    bad_param("logprobs",
              "logprobs are not available on this server: its output guardrails may redact parts "
              "of an answer, which the tokens' logprobs would show");
  const uint64_t seed = r.seeded ? r.sampling.seed : random_u64();
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int64_t j = 0; j < r.n; ++j) {
      p.prefix.push_back(r.echo ? texts[i] : std::string());
      if (r.echo && r.logprobs) p.echo_ids.push_back(prompts[i]);
      if (r.prompt_only) continue;
      GenerationRequest g;
      g.prompt = prompts[i];
      const int64_t room = ctx.max_len - int64_t(g.prompt.size()) - virt;
      g.max_new_tokens = r.max_tokens > 0             ? r.max_tokens
                         : ctx.default_max_tokens > 0 ? std::min(ctx.default_max_tokens, room)
                                                      : room;
      g.stop = r.stop;
      g.stop_at_eos = !r.ignore_eos;
      g.sampling = r.sampling;
      g.sampling.seed = seed + uint64_t(j);
      g.logprobs = r.logprobs;
      g.top_logprobs = r.top_logprobs;
      p.sequences.push_back(std::move(g));
    }
  return p;
}

HttpReply answer_completion(const ServeContext& ctx, PreparedCompletion p,
                            ServeClock::time_point arrival, std::shared_ptr<RequestTally> tally,
                            std::shared_ptr<void> hold) {
  tally->prompt_tokens = p.prompt_tokens;
  HttpReply reply;
  if (ctx.guardrails)
    if (const InputVerdict v = ctx.guardrails->check_input(ctx, p.req)) {
      fmt::print(stderr, "nekton serve: guardrail {} refused a request ({})\n", v.rail, v.detail);
      reply.response = answer_refusal(ctx, p);
      return reply;
    }
  if (!p.echo_ids.empty()) p.echoed = score_prompts(ctx, p.echo_ids, p.req.top_logprobs);
  if (p.req.prompt_only) {
    const std::vector<ChoiceOutput> none(p.prefix.size());
    HttpResponse r;
    r.body =
        dump_json(text_completion(response_head(ctx, p.req.kind), ctx.tok, none, p.req.logprobs,
                                  p.prefix, usage_json(p.prompt_tokens, 0), p.echoed));
    reply.response = std::move(r);
    return reply;
  }
  const size_t n = p.sequences.size();
  auto channel = ctx.engine.submit(std::move(p.sequences), arrival);
  if (!p.req.stream) {
    reply.later = std::make_shared<WholeAnswer>(ctx, std::move(p), std::move(channel),
                                                std::move(tally), std::move(hold));
    return reply;
  }
  auto s = std::make_shared<StreamState>();
  s->ctx = &ctx;
  s->p = std::move(p);
  s->head = response_head(ctx, s->p.req.kind);
  s->channel = channel;
  s->choices.resize(n);
  s->sent_tokens.assign(n, 0);
  s->sent_bytes.assign(n, 0);
  s->filters = output_filters(ctx, n);
  s->ended.assign(n, 0);
  s->open = int64_t(n);
  s->last_write = ServeClock::now();
  s->tally = std::move(tally);
  s->hold = std::move(hold);
  reply.later = std::make_shared<StreamAnswer>(std::move(s));
  return reply;
}

}  // namespace nk
