#include "infer/generate.h"

#include <algorithm>
#include <deque>

#include "ops/ops.h"

namespace nk {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Length:
      return "length";
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Eos:
      return "eos";
    case FinishReason::Context:
      return "context";
  }
  return "?";
}

namespace {

// Length of the longest suffix of text[from:] that is a proper prefix of a
// stop string: bytes that a later token could turn into a stop match.
size_t held_for_stop(const std::string& text, size_t from, const std::vector<std::string>& stop) {
  size_t best = 0;
  for (const std::string& s : stop)
    for (size_t n = std::min(s.size() - 1, text.size() - from); n > best; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        best = n;
        break;
      }
  return best;
}

// The largest end <= `end` that does not cut a UTF-8 character short (bytes
// of an incomplete final character are held; invalid bytes are not).
size_t utf8_boundary(const std::string& text, size_t begin, size_t end) {
  for (size_t back = 1; back <= 3 && back <= end - begin; ++back) {
    const unsigned char c = static_cast<unsigned char>(text[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? end - back : end;
  }
  return end;
}

}  // namespace

size_t streamable_end(const std::string& text, size_t from, const std::vector<std::string>& stop) {
  const size_t end = utf8_boundary(text, from, text.size() - held_for_stop(text, from, stop));
  return std::max(end, from);
}

namespace {

struct Seq {
  int64_t req = 0, slot = 0;
  std::vector<int32_t> ids;  // prompt, then generated
  int64_t cached = 0;        // ids whose k/v are in the cache
  int64_t limit = 0;         // ids the cache can take (positions)
  size_t stop_len = 0;       // longest stop string
  size_t emitted = 0;        // bytes of text passed to the callback
  Sampler sampler;
  explicit Seq(const SamplingConfig& c) : sampler(c) {}
};

}  // namespace

Generator::Generator(Transformer& model, const Tokenizer* tok, int64_t batch_size,
                     int64_t prefill_chunk)
    : model_(model), tok_(tok), batch_(batch_size), chunk_(prefill_chunk) {
  NK_CHECK(batch_size > 0 && prefill_chunk > 0, "Generator: batch {}, prefill chunk {}", batch_size,
           prefill_chunk);
}

std::vector<GenerationResult> Generator::run(const std::vector<GenerationRequest>& reqs,
                                             const TokenCallback& on_token,
                                             const LogitsCallback& on_logits) {
  const ModelConfig& c = model_.config();
  const int64_t V = c.vocab_size;
  int64_t need_len = 1;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerationRequest& r = reqs[i];
    if (r.prompt.empty()) fail("generate: prompt {} is empty", i);
    for (size_t j = 0; j < r.prompt.size(); ++j)
      if (r.prompt[j] < 0 || r.prompt[j] >= V)
        fail("generate: prompt {}: token {} at position {} is outside the vocabulary of {}", i,
             r.prompt[j], j, V);
    if (int64_t(r.prompt.size()) >= c.max_seq_len)
      fail("generate: prompt {} has {} tokens; model.max_seq_len = {} leaves no room to generate",
           i, r.prompt.size(), c.max_seq_len);
    if (r.max_new_tokens < 0)
      fail("generate: prompt {}: max_new_tokens {} < 0", i, r.max_new_tokens);
    if (!r.stop.empty() && !tok_) fail("generate: stop strings need a tokenizer");
    for (const std::string& s : r.stop)
      if (s.empty()) fail("generate: prompt {}: empty stop string", i);
    try {
      validate(r.sampling);
    } catch (const Error& e) {
      throw e.with_context(fmt::format("generate: prompt {}", i));
    }
    // The last sampled token is never fed back, hence the - 1.
    need_len = std::max<int64_t>(need_len, int64_t(r.prompt.size()) + r.max_new_tokens - 1);
  }
  need_len = std::min(need_len, c.max_seq_len);
  const int64_t max_tokens = batch_ + chunk_;
  if (!cache_ || cache_->max_len() < need_len)
    cache_ = std::make_unique<KVCache>(c, model_.compute_dtype(), batch_, need_len, max_tokens);
  const int64_t limit = cache_->max_len();

  std::vector<GenerationResult> results(reqs.size());
  std::deque<int64_t> waiting;
  for (size_t i = 0; i < reqs.size(); ++i) waiting.push_back(int64_t(i));
  std::vector<int64_t> free_slots;
  for (int64_t s = batch_ - 1; s >= 0; --s) free_slots.push_back(s);
  std::vector<std::unique_ptr<Seq>> active;
  std::vector<int32_t> tokens, slots, positions, rows;
  std::vector<Seq*> row_seq;
  Tensor logits = Tensor::empty({batch_, V}, DType::F32);
  std::vector<float> host(size_t(batch_ * V));
  const int32_t eod = tok_ ? tok_->eod_id() : -1;

  // Appends `token` to s; returns true when s is finished.
  auto accept = [&](Seq& s, int32_t token) {
    const GenerationRequest& r = reqs[size_t(s.req)];
    GenerationResult& res = results[size_t(s.req)];
    std::string& text = res.text;
    bool done = false;
    if (r.stop_at_eos && token == eod) {
      res.finish = FinishReason::Eos;
      done = true;
    } else {
      s.ids.push_back(token);
      res.tokens.push_back(token);
      const size_t old = text.size();
      if (tok_) text += tok_->token_bytes(token);
      size_t cut = std::string::npos;
      if (s.stop_len) {
        const size_t from = old >= s.stop_len ? old - s.stop_len + 1 : 0;
        for (const std::string& st : r.stop) cut = std::min(cut, text.find(st, from));
      }
      if (cut != std::string::npos) {
        text.resize(cut);
        res.finish = FinishReason::Stop;
        done = true;
      } else if (int64_t(res.tokens.size()) >= r.max_new_tokens) {
        res.finish = FinishReason::Length;
        done = true;
      } else if (int64_t(s.ids.size()) > s.limit) {
        res.finish = FinishReason::Context;
        done = true;
      }
    }
    if (on_token) {
      const size_t end = done ? text.size() : streamable_end(text, s.emitted, r.stop);
      on_token(s.req, token, std::string_view(text).substr(s.emitted, end - s.emitted));
      s.emitted = end;
    }
    return done;
  };

  while (!waiting.empty() || !active.empty()) {
    while (!waiting.empty() && !free_slots.empty()) {
      const int64_t i = waiting.front();
      waiting.pop_front();
      const GenerationRequest& r = reqs[size_t(i)];
      if (r.max_new_tokens == 0) continue;  // nothing to do; result stays empty
      auto s = std::make_unique<Seq>(r.sampling);
      s->req = i;
      s->slot = free_slots.back();
      free_slots.pop_back();
      s->ids = r.prompt;
      s->limit = limit;
      for (const std::string& st : r.stop) s->stop_len = std::max(s->stop_len, st.size());
      active.push_back(std::move(s));
    }
    if (active.empty()) break;
    // One step: every decoding sequence's last token first, then prompt
    // chunks while the workspace has room.
    tokens.clear();
    slots.clear();
    positions.clear();
    rows.clear();
    row_seq.clear();
    int64_t budget = max_tokens;
    for (int pass = 0; pass < 2; ++pass)
      for (auto& sp : active) {
        Seq& s = *sp;
        const int64_t pending = int64_t(s.ids.size()) - s.cached;
        const bool decoding = s.cached > 0 && pending == 1;
        if ((pass == 0) != decoding || pending <= 0 || budget <= 0) continue;
        const int64_t n = std::min(pending, pass == 0 ? int64_t(1) : std::min(budget, chunk_));
        for (int64_t k = 0; k < n; ++k) {
          tokens.push_back(s.ids[size_t(s.cached + k)]);
          slots.push_back(int32_t(s.slot));
          positions.push_back(int32_t(s.cached + k));
        }
        s.cached += n;
        budget -= n;
        if (s.cached == int64_t(s.ids.size())) {
          rows.push_back(int32_t(tokens.size() - 1));
          row_seq.push_back(&s);
        }
      }
    const int64_t R = int64_t(rows.size());
    Tensor lg = logits.narrow0(0, R);
    model_.forward_cached(*cache_, CachedStep{tokens, slots, positions, rows}, lg);
    if (R) ops::copy_to_host(lg, host.data());
    for (int64_t r = 0; r < R; ++r) {
      Seq& s = *row_seq[size_t(r)];
      const float* l = host.data() + r * V;
      if (on_logits) on_logits(s.req, l, V);
      if (accept(s, s.sampler.sample(l, V, s.ids))) {
        free_slots.push_back(s.slot);
        s.req = -1;  // marks it finished
      }
    }
    std::erase_if(active, [](const std::unique_ptr<Seq>& s) { return s->req < 0; });
  }
  return results;
}

}  // namespace nk
