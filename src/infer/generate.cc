#include "infer/generate.h"

#include <algorithm>
#include <cmath>
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
    case FinishReason::Cancelled:
      return "cancelled";
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

struct Generator::Sequence {
  int64_t id = 0;
  GenerationRequest req;  // its prompt moved into ids
  GenerationResult res;
  Sampler sampler;
  std::vector<int32_t> ids;  // p-tuning's virtual tokens (placeholders), prompt, then generated
  size_t prompt_end = 0;     // where the generated ids begin in ids
  int64_t need = 0;          // positions it may come to hold (capped by the cache's room)
  int32_t handle = SequenceCache::kNoRoom;  // its room in the cache while running
  int64_t cached = 0;                       // ids whose k/v are in the cache
  int64_t limit = 0;                        // ids the cache can take (positions)
  size_t stop_len = 0;                      // longest stop string
  size_t emitted = 0;                       // bytes of text passed on in events
  bool done = false;
  Sequence(const SamplingConfig& c, int64_t vocab) : sampler(c, vocab) {}
};

namespace {

// The ids sampled and reported: the tokenizer's (Sampler: a model's rows past
// them are padding), or every row of the model without a tokenizer.
int64_t token_vocab(const Transformer& model, const Tokenizer* tok) {
  model.need_lm_head("generate");
  const int64_t V = model.config().vocab_size;
  if (!tok) return V;
  if (tok->vocab_size() > V)
    fail(
        "generate: the tokenizer has {} ids, more than the model's vocabulary of {} rows (not "
        "the model's tokenizer?)",
        tok->vocab_size(), V);
  return tok->vocab_size();
}

}  // namespace

Generator::Generator(Transformer& model, const Tokenizer* tok, int64_t batch_size,
                     int64_t prefill_chunk, int64_t max_len, KvDType kv_dtype)
    : model_(model),
      tok_(tok),
      vocab_(token_vocab(model, tok)),
      batch_(batch_size),
      chunk_(prefill_chunk),
      auto_size_(max_len == 0),
      kv_dtype_(kv_dtype) {
  NK_CHECK(batch_size > 0 && prefill_chunk > 0 && max_len >= 0,
           "Generator: batch {}, prefill chunk {}, max_len {}", batch_size, prefill_chunk, max_len);
  if (max_len > 0)
    cache_ = std::make_unique<SlotCache>(model.config(), model.compute_dtype(), batch_size, max_len,
                                         batch_size + prefill_chunk, model.device(), kv_dtype,
                                         model.tensor_parallel().size(),
                                         model.tensor_parallel().expert_size());
  logits_ = Tensor::empty({batch_, model.config().vocab_size}, DType::F32, model.device());
}

Generator::Generator(Transformer& model, const Tokenizer* tok, std::unique_ptr<SequenceCache> cache,
                     int64_t batch_size)
    : model_(model),
      tok_(tok),
      vocab_(token_vocab(model, tok)),
      batch_(batch_size),
      chunk_(0),
      auto_size_(false),
      cache_(std::move(cache)) {
  NK_CHECK(cache_ && batch_size > 0, "Generator: no cache, or batch {}", batch_size);
  chunk_ = cache_->max_tokens();
  logits_ = Tensor::empty({batch_, model.config().vocab_size}, DType::F32, model.device());
}

Generator::~Generator() = default;

void Generator::check(const GenerationRequest& r, const std::string& name) const {
  const ModelConfig& c = model_.config();
  if (r.prompt.empty()) fail("generate: {} is empty", name);
  for (size_t j = 0; j < r.prompt.size(); ++j)
    if (r.prompt[j] < 0 || r.prompt[j] >= vocab_)
      fail("generate: {}: token {} at position {} is outside the vocabulary of {}{}", name,
           r.prompt[j], j, vocab_,
           vocab_ < c.vocab_size
               ? fmt::format(" (the tokenizer's; ids from {} to the model's {} are padding)",
                             vocab_, c.vocab_size)
               : "");
  // p-tuning's virtual tokens come first and take positions too.
  const int64_t n = int64_t(r.prompt.size()) + c.prompt.virtual_tokens;
  const std::string virt =
      c.prompt.enabled() ? fmt::format(" (and {} virtual tokens)", c.prompt.virtual_tokens) : "";
  if (auto_size_ && n >= c.max_seq_len)
    fail("generate: {} has {} tokens{}; model.max_seq_len = {} leaves no room to generate", name,
         r.prompt.size(), virt, c.max_seq_len);
  if (!auto_size_ && n >= cache_->max_len())
    fail(
        "generate: {} has {} tokens{}; the KV cache holds {} positions per sequence, which "
        "leaves no room to generate",
        name, r.prompt.size(), virt, cache_->max_len());
  if (r.max_new_tokens < 0) fail("generate: {}: max_new_tokens {} < 0", name, r.max_new_tokens);
  if (!r.stop.empty() && !tok_) fail("generate: stop strings need a tokenizer");
  for (const std::string& s : r.stop)
    if (s.empty()) fail("generate: {}: empty stop string", name);
  if (r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs)
    fail("generate: {}: top_logprobs {} is outside [0, {}]", name, r.top_logprobs, kMaxTopLogprobs);
  if (r.top_logprobs > 0 && !r.logprobs)
    fail("generate: {}: top_logprobs {} needs logprobs", name, r.top_logprobs);
  try {
    validate(r.sampling);
  } catch (const Error& e) {
    throw e.with_context(fmt::format("generate: {}", name));
  }
}

int64_t Generator::submit(GenerationRequest r) {
  check(r, fmt::format("prompt {}", next_id_));
  auto s = std::make_unique<Sequence>(r.sampling, vocab_);
  s->id = next_id_++;
  // The model gives positions below the virtual count the prompt's
  // embeddings, whatever their ids (model/transformer.h).
  s->ids.assign(size_t(model_.config().prompt.virtual_tokens), 0);
  s->ids.insert(s->ids.end(), r.prompt.begin(), r.prompt.end());
  s->prompt_end = s->ids.size();
  r.prompt.clear();
  s->req = std::move(r);
  for (const std::string& st : s->req.stop) s->stop_len = std::max(s->stop_len, st.size());
  // The last sampled token is never fed back, hence the - 1.
  const int64_t cap = auto_size_ ? model_.config().max_seq_len : cache_->max_len();
  s->need = std::clamp<int64_t>(int64_t(s->ids.size()) + s->req.max_new_tokens - 1, 1, cap);
  Sequence& q = *s;
  seqs_.emplace(q.id, std::move(s));
  if (q.req.max_new_tokens == 0)
    q.done = true;  // nothing to do; result stays empty (finish length)
  else
    waiting_.push_back(&q);
  return q.id;
}

Generator::Sequence& Generator::find(int64_t id, const char* what) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end())
    fail("Generator::{}: no sequence {} (never submitted, or released)", what, id);
  return *it->second;
}

bool Generator::finished(int64_t id) const {
  return find(id, "finished").done;
}

const GenerationResult& Generator::result(int64_t id) const {
  return find(id, "result").res;
}

GenerationResult Generator::release(int64_t id) {
  Sequence& s = find(id, "release");
  if (!s.done) fail("Generator::release: sequence {} is still running (cancel it first)", id);
  GenerationResult r = std::move(s.res);
  seqs_.erase(id);
  return r;
}

void Generator::finish(Sequence& s, FinishReason why) {
  s.res.finish = why;
  s.done = true;
  if (s.handle != SequenceCache::kNoRoom) {
    cache_->close(s.handle);
    s.handle = SequenceCache::kNoRoom;
  }
}

bool Generator::cancel(int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second->done) return false;
  Sequence& s = *it->second;
  std::erase(waiting_, &s);
  std::erase(active_, &s);
  finish(s, FinishReason::Cancelled);
  return true;
}

// With the cache ours to size: when nothing runs, (re)allocate it for the
// longest waiting request, never shrinking (a cache of the same positions
// and slots is what run() always used, so outputs stay as they were).
void Generator::fit_cache() {
  if (!auto_size_ || !active_.empty() || waiting_.empty()) return;
  int64_t want = 1;
  for (const Sequence* s : waiting_) want = std::max(want, s->need);
  if (cache_ && cache_->max_len() >= want) return;
  cache_ = std::make_unique<SlotCache>(
      model_.config(), model_.compute_dtype(), batch_, want, batch_ + chunk_, model_.device(),
      kv_dtype_, model_.tensor_parallel().size(), model_.tensor_parallel().expert_size());
}

void Generator::admit() {
  fit_cache();
  while (!waiting_.empty() && int64_t(active_.size()) < batch_) {
    Sequence& s = *waiting_.front();
    const SequenceCache::Opened o = cache_->open(s.need, s.ids);
    if (o.handle == SequenceCache::kNoRoom) break;  // first come, first served: the rest wait too
    waiting_.pop_front();
    s.handle = o.handle;
    s.cached = o.cached;  // a prefix the cache holds already
    prefix_hits_ += o.cached;
    s.limit = cache_->max_len();
    active_.push_back(&s);
  }
}

// Out of cache room: s gives its memory back and waits at the head of the
// queue (first to return); everything it has, prompt and generated tokens, is
// computed again when it does. Its sampler keeps its state, so its tokens are
// those it would have sampled anyway.
void Generator::preempt(Sequence& s) {
  cache_->close(s.handle);
  s.handle = SequenceCache::kNoRoom;
  s.cached = 0;
  std::erase(active_, &s);
  waiting_.push_front(&s);
  ++preemptions_;
}

// Appends `token` to s; returns true when s is finished.
bool Generator::accept(Sequence& s, int32_t token, float logprob,
                       std::span<const TokenLogprob> top) {
  const GenerationRequest& r = s.req;
  GenerationResult& res = s.res;
  std::string& text = res.text;
  const int32_t eod = tok_ ? tok_->eod_id() : -1;
  if (r.stop_at_eos &&
      (token == eod || std::find(end_ids_.begin(), end_ids_.end(), token) != end_ids_.end())) {
    finish(s, FinishReason::Eos);
  } else {
    s.ids.push_back(token);
    res.tokens.push_back(token);
    if (r.logprobs) {
      res.logprobs.push_back(logprob);
      res.top_logprobs.emplace_back(top.begin(), top.end());
    }
    const size_t old = text.size();
    if (tok_) text += tok_->token_bytes(token);
    size_t cut = std::string::npos;
    if (s.stop_len) {
      const size_t from = old >= s.stop_len ? old - s.stop_len + 1 : 0;
      for (const std::string& st : r.stop) cut = std::min(cut, text.find(st, from));
    }
    if (cut != std::string::npos) {
      text.resize(cut);
      finish(s, FinishReason::Stop);
    } else if (int64_t(res.tokens.size()) >= r.max_new_tokens) {
      finish(s, FinishReason::Length);
    } else if (int64_t(s.ids.size()) > s.limit) {
      finish(s, FinishReason::Context);
    }
  }
  const size_t end = s.done ? text.size() : streamable_end(text, s.emitted, r.stop);
  events_.push_back({s.id, token, std::string_view(text).substr(s.emitted, end - s.emitted), s.done,
                     logprob, top});
  s.emitted = end;
  return s.done;
}

std::span<const TokenEvent> Generator::step(const LogitsCallback& on_logits) {
  events_.clear();
  admit();
  NK_CHECK(!active_.empty() || waiting_.empty(),
           "Generator: the cache cannot take prompt {} ({} positions) even when empty",
           waiting_.front()->id, waiting_.front()->need);
  if (active_.empty()) return {};
  // Every decoding sequence's last token first, then prompt chunks while the
  // workspace has room.
  buf_.clear();
  row_seq_.clear();
  int64_t budget = cache_->max_tokens();
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < active_.size(); ++i) {
      Sequence& s = *active_[i];
      const int64_t pending = int64_t(s.ids.size()) - s.cached;
      const bool decoding = s.cached > 0 && pending == 1;
      if ((pass == 0) != decoding || pending <= 0 || budget <= 0) continue;
      const int64_t n = std::min(pending, pass == 0 ? int64_t(1) : std::min(budget, chunk_));
      const std::span<const int32_t> ids = std::span(s.ids).subspan(size_t(s.cached), size_t(n));
      // Decoding sequences come first, oldest first: when the cache is full,
      // the newest sequences not yet in this step make room, down to s
      // itself. (A prompt chunk's room was taken when its sequence opened.)
      bool placed = cache_->append(s.handle, s.cached, ids, buf_);
      while (!placed && pass == 0 && active_.size() > i + 1) {
        preempt(*active_.back());
        placed = cache_->append(s.handle, s.cached, ids, buf_);
      }
      if (!placed && pass == 0) {
        preempt(s);
        --i;  // the next sequence moved into slot i (i wraps at 0 and back)
        continue;
      }
      if (!placed) continue;  // a prompt chunk waits for a later step
      s.cached += n;
      budget -= n;
      if (s.cached == int64_t(s.ids.size())) {
        buf_.logit_rows.push_back(int32_t(buf_.tokens.size() - 1));
        row_seq_.push_back(&s);
      }
    }
  if (buf_.tokens.empty()) return events_;  // the only sequence was preempted
  const int64_t R = int64_t(row_seq_.size()), V = model_.config().vocab_size;
  Tensor lg = logits_.narrow0(0, R);
  cache_->forward(model_, buf_, lg);
  host_.resize(size_t(R * V));
  if (R) ops::copy_to_host(lg, host_.data());
  // Events' top lists point into top_: room for all of them up front, so it
  // does not move during the step.
  top_.clear();
  top_.reserve(size_t(R * kMaxTopLogprobs));
  const size_t virt = size_t(model_.config().prompt.virtual_tokens);
  for (int64_t r = 0; r < R; ++r) {
    Sequence& s = *row_seq_[size_t(r)];
    const float* l = host_.data() + r * V;
    if (on_logits) on_logits(s.id, l, V);
    const std::span<const int32_t> ids(s.ids);
    const int32_t token =
        s.sampler.sample(l, V, ids.subspan(virt, s.prompt_end - virt), ids.subspan(s.prompt_end));
    float logprob = 0;
    std::span<const TokenLogprob> top;
    if (s.req.logprobs) {
      const size_t first = top_.size();
      logprob = float(raw_logprobs(l, vocab_, token, s.req.top_logprobs, top_));
      top = std::span<const TokenLogprob>(top_).subspan(first);
    }
    accept(s, token, logprob, top);
  }
  std::erase_if(active_, [](const Sequence* s) { return s->done; });
  return events_;
}

std::vector<GenerationResult> Generator::run(const std::vector<GenerationRequest>& reqs,
                                             const TokenCallback& on_token,
                                             const LogitsCallback& on_logits) {
  for (size_t i = 0; i < reqs.size(); ++i) check(reqs[i], fmt::format("prompt {}", i));
  if (reqs.empty()) return {};
  const int64_t first = next_id_, n = int64_t(reqs.size());
  for (const GenerationRequest& r : reqs) submit(r);
  // Ids first..first+n-1 are ours; other sequences may share the steps.
  auto ours = [&](int64_t id) { return id >= first && id < first + n; };
  int64_t open = 0;
  for (int64_t i = 0; i < n; ++i) open += !finished(first + i);
  const LogitsCallback logits_cb = [&](int64_t id, const float* l, int64_t V) {
    if (ours(id)) on_logits(id - first, l, V);
  };
  while (open > 0) {
    for (const TokenEvent& e : step(on_logits ? logits_cb : LogitsCallback())) {
      if (!ours(e.id)) continue;
      if (on_token) on_token(e.id - first, e.token, e.piece);
      open -= e.finished;
    }
  }
  std::vector<GenerationResult> results;
  for (int64_t i = 0; i < n; ++i) results.push_back(release(first + i));
  return results;
}

}  // namespace nk
