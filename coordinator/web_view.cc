#include "coordinator/web_view.h"

#include <grpcpp/grpcpp.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/channel.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/metrics_http.h"
#include "common/status_macros.h"
#include "coordinator/status_json.h"
#include "coordinator/web_assets.h"
#include "common/json_writer.h"
#include "ptc/layout.h"
#include "ptc/layout_spec_proto.h"
#include "ptc/model_spec.h"
#include "proto/coordinator.grpc.pb.h"

namespace ptc {
namespace {

constexpr int kTimeoutMs = 2000;
constexpr size_t kMaxHead = 16 << 10;
constexpr char kCookie[] = "ptc_view";

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "unknown error";
  char buffer[256];
  ERR_error_string_n(e, buffer, sizeof(buffer));
  return buffer;
}

// One connection, plain or TLS: reads and writes within the socket's
// timeouts.
class Conn {
 public:
  Conn(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  ssize_t Read(char* buffer, size_t n) {
    if (ssl_ != nullptr) return SSL_read(ssl_, buffer, static_cast<int>(n));
    return recv(fd_, buffer, n, 0);
  }
  void Write(const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n =
          ssl_ != nullptr
              ? SSL_write(ssl_, data.data() + done,
                          static_cast<int>(data.size() - done))
              : send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;
      done += n;
    }
  }

 private:
  const int fd_;
  SSL* const ssl_;
};

struct Request {
  std::string method, path;
  std::map<std::string, std::string> query;
  std::map<std::string, std::string> headers;  // lower-case names
};

// Parses the head of an HTTP/1.1 request; false if it is not one.
bool Parse(const std::string& head, Request* r) {
  std::vector<std::string> lines =
      absl::StrSplit(head, absl::ByAnyChar("\r\n"), absl::SkipEmpty());
  if (lines.empty()) return false;
  std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
  if (first.size() != 3 || !absl::StartsWith(first[2], "HTTP/1.")) return false;
  r->method = first[0];
  const std::string target = first[1];
  const size_t q = target.find('?');
  r->path = target.substr(0, q);
  if (q != std::string::npos) {
    for (absl::string_view kv :
         absl::StrSplit(target.substr(q + 1), '&', absl::SkipEmpty())) {
      const size_t eq = kv.find('=');
      r->query[std::string(kv.substr(0, eq))] =
          eq == absl::string_view::npos ? "" : std::string(kv.substr(eq + 1));
    }
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    r->headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  return true;
}

bool SameToken(const std::string& a, const std::string& b) {
  return a.size() == b.size() &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// The token the request shows: its cookie, or a bearer authorization.
std::string ShownToken(const Request& r) {
  auto it = r.headers.find("authorization");
  if (it != r.headers.end() && absl::StartsWith(it->second, "Bearer "))
    return it->second.substr(7);
  it = r.headers.find("cookie");
  if (it == r.headers.end()) return "";
  for (absl::string_view c : absl::StrSplit(it->second, ';')) {
    c = absl::StripAsciiWhitespace(c);
    if (absl::ConsumePrefix(&c, absl::StrCat(kCookie, "=")))
      return std::string(c);
  }
  return "";
}

std::string Response(const std::string& status, const std::string& type,
                     const std::string& body,
                     const std::string& extra_headers = "") {
  return absl::StrCat(
      "HTTP/1.1 ", status, "\r\nContent-Type: ", type,
      "\r\nContent-Length: ", body.size(),
      "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff"
      "\r\nX-Frame-Options: DENY\r\nReferrer-Policy: no-referrer"
      "\r\nContent-Security-Policy: default-src 'self'; img-src 'self' data:;"
      " frame-ancestors 'none'\r\n",
      extra_headers, "Connection: close\r\n\r\n", body);
}

std::string JsonError(const std::string& message) {
  std::string escaped;
  for (char c : message) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    escaped += c;
  }
  return absl::StrCat("{\"error\": \"", escaped, "\"}");
}

// One tensor of a job's layout as the page draws it: the job's tensors
// (names, shapes), and the chosen one's distinct regions with the ranks
// holding each (replicas: more than one rank).
//   {"job", "config", "layout_epoch", "rank_hosts": [..],
//    "tensors": [{"key", "shape"}], "tensor": {"index", "key", "dtype",
//    "shape", "regions": [{"region": [[b, e], ..], "ranks": [..]}]}}
absl::StatusOr<std::string> LayoutJson(const proto::JobStatus& j,
                                       int tensor) {
  PTC_ASSIGN_OR_RETURN(const ModelSpec spec, SpecFromProto(j.layout()));
  PTC_ASSIGN_OR_RETURN(const ParallelConfig config,
                       spec.ParseConfig(j.config()));
  PTC_ASSIGN_OR_RETURN(const Layout layout, BuildLayout(spec, config));
  if (tensor < 0 || tensor >= layout.num_tensors()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", tensor, " is outside the job's ",
                     layout.num_tensors(), " tensors"));
  }
  JsonWriter w;
  w.BeginObject().Key("job").String(j.job()).Key("config").String(j.config());
  w.Key("layout_epoch").Int(j.layout_epoch()).Key("rank_hosts").BeginArray();
  for (const auto& h : j.rank_hosts()) w.String(h);
  w.EndArray().Key("tensors").BeginArray();
  for (const TensorSpec& t : spec.tensors) {
    w.BeginObject().Key("key").String(t.key).Key("shape").BeginArray();
    for (int64_t e : t.shape) w.Int(e);
    w.EndArray().EndObject();
  }
  w.EndArray();
  const TensorSpec& t = spec.tensors[tensor];
  w.Key("tensor").BeginObject().Key("index").Int(tensor);
  w.Key("key").String(t.key).Key("dtype").String(DTypeName(t.dtype));
  w.Key("shape").BeginArray();
  for (int64_t e : t.shape) w.Int(e);
  w.EndArray();
  // Distinct regions in the order first held, with their ranks.
  std::vector<std::pair<Region, std::vector<int32_t>>> regions;
  std::map<std::string, size_t> index;
  for (const Shard& shard : layout.shards(tensor)) {
    if (shard.region.empty()) continue;
    auto [it, added] =
        index.try_emplace(shard.region.ToString(), regions.size());
    if (added) regions.push_back({shard.region, {}});
    regions[it->second].second.push_back(shard.rank);
  }
  w.Key("regions").BeginArray();
  for (const auto& [region, ranks] : regions) {
    w.BeginObject().Key("region").BeginArray();
    for (int d = 0; d < region.rank(); ++d) {
      w.BeginArray().Int(region.dim(d).begin).Int(region.dim(d).end);
      w.EndArray();
    }
    w.EndArray().Key("ranks").BeginArray();
    for (int32_t r : ranks) w.Int(r);
    w.EndArray().EndObject();
  }
  w.EndArray().EndObject().EndObject();
  return w.str();
}

}  // namespace

struct WebView::Tls {
  SSL_CTX* ctx = nullptr;
  ~Tls() {
    if (ctx != nullptr) SSL_CTX_free(ctx);
  }
};

absl::StatusOr<std::string> WebView::ReadToken(const std::string& path) {
  std::ifstream in(path);
  std::string token;
  if (!in || !std::getline(in, token)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the web view's token from ", path));
  }
  token = std::string(absl::StripAsciiWhitespace(token));
  const bool plain = std::all_of(token.begin(), token.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '~' ||
           c == '-';
  });
  if (token.size() < 16 || !plain) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the web view's token in ", path,
        " must be at least 16 characters of letters, digits and ._~- (e.g. "
        "openssl rand -hex 16 > ",
        path, ")"));
  }
  return token;
}

absl::StatusOr<std::unique_ptr<WebView>> WebView::Start(Options options) {
  if (options.token.size() < 16) {
    return absl::InvalidArgumentError(
        "the web view needs a viewer token of 16 characters or more");
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "the web view needs both a certificate and a key, or neither");
  }
  auto tls = std::make_unique<Tls>();
  if (!options.tls_cert.empty()) {
    tls->ctx = SSL_CTX_new(TLS_server_method());
    if (tls->ctx == nullptr)
      return absl::InternalError(absl::StrCat("TLS: ", OpenSslError()));
    SSL_CTX_set_min_proto_version(tls->ctx, TLS1_2_VERSION);
    if (SSL_CTX_use_certificate_chain_file(tls->ctx,
                                           options.tls_cert.c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(tls->ctx, options.tls_key.c_str(),
                                    SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(tls->ctx) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("the web view's certificate ", options.tls_cert,
                       " and key ", options.tls_key, ": ", OpenSslError()));
    }
  }
  PTC_ASSIGN_OR_RETURN(const auto listening,
                       ListenTcp(options.listen, "the web view"));
  std::unique_ptr<WebView> view(
      new WebView(std::move(options), listening.first, listening.second));
  // One channel for every request, as any client keeps one.
  view->stub_ = proto::Coordinator::NewStub(OpenChannel(
      view->options_.coordinator, grpc::ChannelArguments(), "coordinator"));
  view->tls_ = std::move(tls);
  view->thread_ = std::thread([v = view.get()] { v->Loop(); });
  Log("web")->info("web view on {}://{} (port {})",
                   view->tls_->ctx != nullptr ? "https" : "http",
                   view->options_.listen, view->port_);
  return view;
}

WebView::WebView(Options options, int fd, int port)
    : options_(std::move(options)), fd_(fd), port_(port) {}

WebView::~WebView() {
  stopping_ = true;
  shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void WebView::Loop() {
  ServeConnections(fd_, stopping_, [this](int conn) {
    // Every read and write of a connection (the TLS handshake too) within
    // the timeout: a client that stops sending cannot hold the thread.
    struct timeval tv = {kTimeoutMs / 1000, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    Serve(conn);
  });
}

absl::StatusOr<std::string> WebView::Api(
    const std::string& path, const std::map<std::string, std::string>& query) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(kTimeoutMs));
  if (path == "/api/hosts") {
    proto::ListHostsResponse resp;
    PTC_RETURN_IF_ERROR(FromGrpcStatus(
        stub_->ListHosts(&ctx, proto::ListHostsRequest(), &resp)));
    return HostsJson(resp);
  }
  if (path == "/api/jobs") {
    proto::ListJobsResponse resp;
    PTC_RETURN_IF_ERROR(
        FromGrpcStatus(stub_->ListJobs(&ctx, proto::ListJobsRequest(), &resp)));
    return JobsJson(resp);
  }
  if (path == "/api/layout") {  // ?job=J&tensor=N (default 0)
    auto arg = [&](const char* key) {
      auto it = query.find(key);
      return it == query.end() ? std::string() : it->second;
    };
    int tensor = 0;
    if (!arg("tensor").empty() && !absl::SimpleAtoi(arg("tensor"), &tensor))
      tensor = -1;
    proto::ListJobsRequest req;
    req.set_job(arg("job"));
    req.set_include_layout(true);
    proto::ListJobsResponse resp;
    PTC_RETURN_IF_ERROR(FromGrpcStatus(stub_->ListJobs(&ctx, req, &resp)));
    if (resp.jobs_size() != 1)
      return absl::NotFoundError(
          absl::StrCat("job '", req.job(), "' is unknown"));
    return LayoutJson(resp.jobs(0), tensor);
  }
  return absl::NotFoundError(absl::StrCat("no ", path, " here"));
}

void WebView::Serve(int fd) {
  SSL* ssl = nullptr;
  if (tls_->ctx != nullptr) {
    ssl = SSL_new(tls_->ctx);
    if (ssl == nullptr) return;
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) != 1) {
      ERR_clear_error();
      SSL_free(ssl);
      return;
    }
  }
  Conn conn(fd, ssl);
  const absl::Time deadline = absl::Now() + absl::Milliseconds(kTimeoutMs);
  std::string head;
  char buffer[2048];
  while (head.size() < kMaxHead && !absl::StrContains(head, "\r\n\r\n") &&
         absl::Now() < deadline) {
    const ssize_t n = conn.Read(buffer, sizeof(buffer));
    if (n <= 0) break;
    head.append(buffer, n);
  }
  Request r;
  const bool parsed = absl::StrContains(head, "\r\n\r\n") && Parse(head, &r);
  auto page = [](const std::string& title, const std::string& text) {
    return absl::StrCat(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        "<title>ptc: ",
        title, "</title></head><body><h1>", title, "</h1><p>", text,
        "</p></body></html>\n");
  };
  if (!parsed) {
    if (!head.empty())
      conn.Write(Response("400 Bad Request", "text/plain", "bad request\n"));
  } else if (r.method != "GET") {
    conn.Write(Response("405 Method Not Allowed", "text/plain",
                        "the web view is read-only: GET only\n"));
  } else if (r.path == "/" && r.query.count("token") > 0) {
    // The link an operator opens once: the token becomes a cookie, and the
    // address bar loses it.
    if (SameToken(r.query["token"], options_.token)) {
      conn.Write(Response(
          "303 See Other", "text/plain", "",
          absl::StrCat("Location: /\r\nSet-Cookie: ", kCookie, "=",
                       options_.token, "; Path=/; HttpOnly; SameSite=Strict",
                       tls_->ctx != nullptr ? "; Secure" : "", "\r\n")));
    } else {
      conn.Write(Response("401 Unauthorized", "text/html; charset=utf-8",
                          page("wrong token",
                               "This is not the viewer token of this "
                               "coordinator (its --web-token-file).")));
    }
  } else if (!SameToken(ShownToken(r), options_.token)) {
    conn.Write(Response(
        "401 Unauthorized", "text/html; charset=utf-8",
        page("ptc: sign in",
             "Open this address with <code>/?token=TOKEN</code>, TOKEN being "
             "the viewer token in the coordinator's --web-token-file (not an "
             "admin credential: it can only look).")));
  } else if (absl::StartsWith(r.path, "/api/")) {
    const absl::StatusOr<std::string> body = Api(r.path, r.query);
    if (body.ok()) {
      conn.Write(Response("200 OK", "application/json", *body));
    } else {
      conn.Write(Response(
          absl::IsInvalidArgument(body.status()) ? "400 Bad Request"
          : absl::IsNotFound(body.status())      ? "404 Not Found"
                                                 : "502 Bad Gateway",
          "application/json", JsonError(body.status().ToString())));
    }
  } else {
    const std::string path = r.path == "/" ? "/index.html" : r.path;
    const WebAsset* found = nullptr;
    for (int i = 0; i < kWebAssetCount; ++i)
      if (path == kWebAssets[i].path) found = &kWebAssets[i];
    if (found != nullptr) {
      conn.Write(Response("200 OK", found->type, std::string(found->body)));
    } else {
      conn.Write(Response("404 Not Found", "text/plain", "not found\n"));
    }
  }
  if (ssl != nullptr) {
    SSL_shutdown(ssl);
    SSL_free(ssl);
  }
  // Closing with a request's unread bytes (a body) in the socket would
  // reset the connection, and the client could lose the answer: the end
  // of writing is sent first, and what is left read and dropped (briefly).
  shutdown(fd, SHUT_WR);
  struct timeval brief = {0, 200 * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &brief, sizeof(brief));
  for (int i = 0; i < 32 && recv(fd, buffer, sizeof(buffer), 0) > 0; ++i) {
  }
}

}  // namespace ptc
