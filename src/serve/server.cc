#include "serve/server.h"

#include <cstring>
#include <ctime>

#include "core/error.h"
#include "serve/completion_route.h"
#include "serve/sse.h"

namespace nk {

using json = nlohmann::json;

namespace {

HttpResponse json_response(const json& j, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(j);
  return r;
}

// The routes and their methods, for 405 and for the endpoint label of
// nekton_requests_total (anything else counts as "other").
struct Route {
  const char* path;
  const char* method;
};
constexpr Route kRoutes[] = {{"/v1/chat/completions", "POST"},
                             {"/v1/completions", "POST"},
                             {"/v1/models", "GET"},
                             {"/health", "GET"},
                             {"/metrics", "GET"},
                             {"/tokenize", "POST"},
                             {"/detokenize", "POST"}};
constexpr const char* kModelsPrefix = "/v1/models/";

const Route* find_route(const std::string& path) {
  for (const Route& r : kRoutes)
    if (path == r.path) return &r;
  return nullptr;
}

std::string endpoint_label(const std::string& path) {
  if (const Route* r = find_route(path)) return r->path;
  if (path.starts_with(kModelsPrefix)) return "/v1/models/{id}";
  return "other";
}

// Counts a completion request as in flight for as long as it lives (an
// answer keeps it until its last byte is written).
std::shared_ptr<void> in_flight_token(const std::shared_ptr<std::atomic<int64_t>>& n) {
  ++*n;
  return std::shared_ptr<void>(nullptr, [n](void*) { --*n; });
}

json model_card(const ServeContext& ctx) {
  static const int64_t created = int64_t(std::time(nullptr));
  return {{"id", ctx.model_name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "nekton"},
          {"max_model_len", ctx.max_len},
          {"root", ctx.model_name},
          {"parent", nullptr}};
}

// OpenAI's code for the statuses the connection layer answers.
const char* refusal_code(int status) {
  switch (status) {
    case 408:
      return "request_timeout";
    case 413:
      return "payload_too_large";
    case 431:
      return "headers_too_large";
    default:
      return "";
  }
}

}  // namespace

OpenAIServer::OpenAIServer(ServeContext& ctx, const HttpLimits& limits)
    : ctx_(ctx), http_(*this, limits) {}

// GET routes answer from memory (the metrics text, the model card): on the
// network thread. The rest tokenize or wait for the engine: on a worker.
bool OpenAIServer::quick(const HttpRequest& req) const {
  return req.method == "GET";
}

HttpReply OpenAIServer::handle(HttpRequest& req) {
  auto tally = std::make_shared<RequestTally>();
  req.note = tally;
  HttpReply out;
  if (draining_.load()) {
    out.response = ApiError(503, "The server is shutting down", "", "", "server_error").response();
    out.response.close = true;
    return out;
  }
  // An ApiError becomes its response, anything else a 500, so that no
  // request can take the server down.
  try {
    return route(req, tally);
  } catch (const ApiError& e) {
    out.response = e.response();
  } catch (const std::bad_alloc&) {
    out.response =
        ApiError(500, "Out of memory while answering the request", "", "", "server_error")
            .response();
  } catch (const std::exception& e) {
    out.response = ApiError(500, std::string("Internal error: ") + e.what(), "", "", "server_error")
                       .response();
  }
  return out;
}

HttpReply OpenAIServer::route(HttpRequest& req, const std::shared_ptr<RequestTally>& tally) {
  ServeContext& ctx = ctx_;
  const std::string& path = req.path;
  const Route* known = find_route(path);
  if (known && req.method != known->method) {
    HttpReply r;
    r.response = ApiError(405, fmt::format("Method {} is not allowed on {} (use {})", req.method,
                                           path, known->method))
                     .response();
    r.response.headers.emplace_back("Allow", known->method);
    return r;
  }
  HttpReply r;
  if (path == "/v1/chat/completions" || path == "/v1/completions") {
    const ApiKind kind = path == "/v1/chat/completions" ? ApiKind::Chat : ApiKind::Completion;
    std::shared_ptr<void> token = in_flight_token(in_flight_);
    return answer_completion(ctx, prepare_completion(ctx, req.body, kind), req.read_at, tally,
                             std::move(token));
  }
  if (path == "/v1/models") {
    r.response = json_response({{"object", "list"}, {"data", json::array({model_card(ctx)})}});
  } else if (path.starts_with(kModelsPrefix) && path.size() > std::strlen(kModelsPrefix) &&
             req.method == "GET") {
    const std::string id = path.substr(std::strlen(kModelsPrefix));
    if (id != ctx.model_name)
      throw ApiError(404, fmt::format("The model `{}` does not exist.", id), "model",
                     "model_not_found");
    r.response = json_response(model_card(ctx));
  } else if (path == "/health") {
    r.response = json_response({{"status", "ok"}});
  } else if (path == "/metrics") {
    r.response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.response.body = ctx.metrics.registry.render();
  } else if (path == "/tokenize") {
    const TokenizeRequest t = parse_tokenize_request(req.body);
    check_model(ctx, t.model);
    std::vector<int32_t> ids;
    if (t.chat)
      ids = chat_prompt_ids(ctx, t.messages, t.chat_end, t.tools);
    else
      ctx.tok.encode_with_specials(t.prompt, ids);
    r.response =
        json_response({{"tokens", ids}, {"count", ids.size()}, {"max_model_len", ctx.max_len}});
  } else if (path == "/detokenize") {
    const DetokenizeRequest d = parse_detokenize_request(req.body);
    check_model(ctx, d.model);
    const int64_t vocab = ctx.tok.vocab_size();
    for (size_t i = 0; i < d.tokens.size(); ++i)
      if (d.tokens[i] >= vocab)
        bad_param(fmt::format("tokens[{}]", i), "token {} is outside the vocabulary ({} tokens)",
                  d.tokens[i], vocab);
    r.response = json_response({{"prompt", ctx.tok.decode(d.tokens)}});
  } else {
    throw ApiError(404, fmt::format("Unknown route: {} {}", req.method, path), "", "not_found");
  }
  return r;
}

HttpResponse OpenAIServer::refusal(const HttpRequest&, int status, const std::string& why) {
  return ApiError(status, why, "", refusal_code(status)).response();
}

void OpenAIServer::finished(const HttpRequest& req, int status) {
  ctx_.metrics.requests.inc(
      1, {{"endpoint", endpoint_label(req.path)}, {"status", std::to_string(status)}});
  const auto* t = static_cast<const RequestTally*>(req.note.get());
  const RequestTally none;
  // From the request read whole (a refused one: from its head, if it came).
  const auto since = req.read_at.time_since_epoch().count() ? req.read_at : req.head_at;
  const double secs = since.time_since_epoch().count()
                          ? std::chrono::duration<double>(ServeClock::now() - since).count()
                          : 0.0;
  fmt::print(stderr, "nekton serve: {} {} {} prompt_tokens={} completion_tokens={} {:.3f}s\n",
             req.method.empty() ? "-" : req.method, req.path.empty() ? "-" : req.path, status,
             (t ? t : &none)->prompt_tokens, (t ? t : &none)->completion_tokens, secs);
}

}  // namespace nk
