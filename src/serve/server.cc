#include "serve/server.h"

#include <ctime>

#include "core/error.h"
#include "serve/completion_route.h"
#include "serve/sse.h"

namespace nk {

using json = nlohmann::json;

RequestTally& request_tally() {
  thread_local RequestTally t;
  return t;
}

namespace {

thread_local ServeClock::time_point t_arrival;

void send_json(httplib::Response& res, const json& j, int status = 200) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.to_json(), e.status());
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

const Route* find_route(const std::string& path) {
  for (const Route& r : kRoutes)
    if (path == r.path) return &r;
  return nullptr;
}

std::string endpoint_label(const std::string& path) {
  if (const Route* r = find_route(path)) return r->path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

// Runs a route's body: an ApiError becomes its response, anything else a
// 500, so that no request can take the server down.
template <class F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request& req, httplib::Response& res) {
    try {
      f(req, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::bad_alloc&) {
      send_error(
          res, ApiError(500, "Out of memory while answering the request", "", "", "server_error"));
    } catch (const std::exception& e) {
      send_error(res,
                 ApiError(500, std::string("Internal error: ") + e.what(), "", "", "server_error"));
    }
  };
}

// Counts a completion request as in flight for as long as it lives (a
// stream keeps it until its last byte).
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

}  // namespace

OpenAIServer::OpenAIServer(ServeContext& ctx, int64_t max_body, int64_t threads) : ctx_(ctx) {
  const size_t n = size_t(threads);
  svr_.new_task_queue = [n] { return new httplib::ThreadPool(n); };
  svr_.set_payload_max_length(size_t(max_body));
  // A client may take its time between tokens of a long request body, not
  // forever.
  svr_.set_read_timeout(30);
  svr_.set_write_timeout(30);
  routes();
}

int OpenAIServer::bind(const std::string& host, int port) {
  const int got =
      port == 0 ? svr_.bind_to_any_port(host) : (svr_.bind_to_port(host, port) ? port : -1);
  if (got <= 0)
    fail(
        "serve.host, serve.port: cannot listen on {}:{} (in use, or not an address of this "
        "machine)",
        host, port);
  return got;
}

void OpenAIServer::listen() {
  svr_.listen_after_bind();
}

void OpenAIServer::stop() {
  svr_.stop();
}

void OpenAIServer::routes() {
  ServeContext& ctx = ctx_;
  svr_.set_pre_routing_handler([this](const httplib::Request&, httplib::Response& res) {
    t_arrival = ServeClock::now();
    request_tally() = {};
    if (!draining_.load()) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Connection", "close");
    send_error(res, ApiError(503, "The server is shutting down", "", "", "server_error"));
    return httplib::Server::HandlerResponse::Handled;
  });
  auto in_flight = in_flight_;
  for (const auto& route : {std::pair{"/v1/chat/completions", ApiKind::Chat},
                            std::pair{"/v1/completions", ApiKind::Completion}}) {
    const ApiKind kind = route.second;
    svr_.Post(route.first,
              guarded([&ctx, in_flight, kind](const httplib::Request& req, httplib::Response& res) {
                std::shared_ptr<void> token = in_flight_token(in_flight);
                answer_completion(ctx, prepare_completion(ctx, req.body, kind), t_arrival, res,
                                  std::move(token));
              }));
  }
  svr_.Get("/v1/models", guarded([&ctx](const httplib::Request&, httplib::Response& res) {
             send_json(res, {{"object", "list"}, {"data", json::array({model_card(ctx)})}});
           }));
  svr_.Get(R"(/v1/models/(.+))",
           guarded([&ctx](const httplib::Request& req, httplib::Response& res) {
             const std::string id = req.matches[1];
             if (id != ctx.model_name)
               throw ApiError(404, fmt::format("The model `{}` does not exist.", id), "model",
                              "model_not_found");
             send_json(res, model_card(ctx));
           }));
  svr_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, {{"status", "ok"}});
  });
  svr_.Get("/metrics", guarded([&ctx](const httplib::Request&, httplib::Response& res) {
             res.set_content(ctx.metrics.registry.render(),
                             "text/plain; version=0.0.4; charset=utf-8");
           }));
  svr_.Post(
      "/tokenize", guarded([&ctx](const httplib::Request& req, httplib::Response& res) {
        const TokenizeRequest r = parse_tokenize_request(req.body);
        check_model(ctx, r.model);
        std::vector<int32_t> ids;
        if (r.chat)
          ids = chat_prompt_ids(ctx, r.messages, r.add_generation_prompt, r.tools);
        else
          ctx.tok.encode_with_specials(r.prompt, ids);
        send_json(res, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", ctx.max_len}});
      }));
  svr_.Post("/detokenize", guarded([&ctx](const httplib::Request& req, httplib::Response& res) {
              const DetokenizeRequest r = parse_detokenize_request(req.body);
              check_model(ctx, r.model);
              const int64_t vocab = ctx.tok.vocab_size();
              for (size_t i = 0; i < r.tokens.size(); ++i)
                if (r.tokens[i] >= vocab)
                  bad_param(fmt::format("tokens[{}]", i),
                            "token {} is outside the vocabulary ({} tokens)", r.tokens[i], vocab);
              send_json(res, {{"prompt", ctx.tok.decode(r.tokens)}});
            }));
  // Errors httplib answers itself (no route: 404; body over the limit: 413;
  // a malformed request line: 400) get OpenAI's shape too; a known path with
  // another method is a 405. Responses the routes filled are left alone.
  svr_.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const Route* r = find_route(req.path);
        if (res.status == 404 && r) {
          res.status = 405;
          res.set_header("Allow", r->method);
          send_error(res, ApiError(405, fmt::format("Method {} is not allowed on {} (use {})",
                                                    req.method, req.path, r->method)));
        } else if (res.status == 404) {
          send_error(res, ApiError(404, fmt::format("Unknown route: {} {}", req.method, req.path),
                                   "", "not_found"));
        } else if (res.status == 413) {
          send_error(res, ApiError(413,
                                   "The request body is over the server's limit "
                                   "(serve.max_body_mb)",
                                   "", "payload_too_large"));
        } else {
          send_error(res, ApiError(res.status, fmt::format("HTTP error {}", res.status)));
        }
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr_.set_logger([&ctx](const httplib::Request& req, const httplib::Response& res) {
    ctx.metrics.requests.inc(
        1, {{"endpoint", endpoint_label(req.path)}, {"status", std::to_string(res.status)}});
    const RequestTally& t = request_tally();
    // A request httplib refused before routing (413) has no arrival time.
    const double secs = t_arrival.time_since_epoch().count()
                            ? std::chrono::duration<double>(ServeClock::now() - t_arrival).count()
                            : 0.0;
    fmt::print(stderr, "nekton serve: {} {} {} prompt_tokens={} completion_tokens={} {:.3f}s\n",
               req.method, req.path, res.status, t.prompt_tokens, t.completion_tokens, secs);
  });
}

}  // namespace nk
