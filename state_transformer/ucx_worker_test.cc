// A sending worker's endpoints to peers are bounded: past the bound the
// least recently used one that no send uses is closed (and made again if
// that peer is sent to later); a broken one is closed, not only forgotten.
#include "state_transformer/ucx_worker.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/metrics.h"

namespace ptc {
namespace {

// A receiving worker of its own thread, as a pulling thread's is.
struct Receiver {
  std::unique_ptr<UcxWorker> worker;
  Receiver() {
    auto w = UcxWorker::Create(/*serve=*/false);
    REQUIRE(w.ok());
    worker = std::move(*w);
  }
};

// `from` sends `bytes` to `to` under `tag` while `to` receives them.
void SendTo(UcxWorker& from, Receiver& to, uint64_t tag,
            const std::vector<char>& bytes) {
  std::vector<char> got(bytes.size());
  auto receive = to.worker->PostReceive(tag, got.data(), got.size());
  REQUIRE(receive.ok());
  absl::StatusOr<size_t> n;
  std::thread wait(
      [&] { n = to.worker->Wait(receive->get(), absl::Seconds(120)); });
  const UcxWorker::SendOp op{tag, bytes.data(), bytes.size()};
  const absl::Status sent = from.Send(to.worker->address(),
                                      absl::MakeConstSpan(&op, 1),
                                      absl::Seconds(120));
  wait.join();
  REQUIRE(sent.ok());
  REQUIRE(n.ok());
  CHECK(*n == bytes.size());
  CHECK(got == bytes);
}

TEST_CASE(
    "ucx worker: past its bound the least recently used endpoint is closed, "
    "and made again when its peer is sent to",
    "[transformer][ucx]") {
  auto sender = UcxWorker::Create(/*serve=*/true, /*max_endpoints=*/2);
  REQUIRE(sender.ok());
  UcxWorker& s = **sender;
  Receiver a, b, c;
  const std::vector<char> bytes(1 << 20, 'x');  // a rendezvous, not eager
  SendTo(s, a, 1, bytes);
  SendTo(s, b, 2, bytes);
  SendTo(s, a, 3, bytes);  // a is now the more recent
  CHECK(s.open_endpoints() == 2);
  CHECK(s.closed_endpoints() == 0);
  SendTo(s, c, 4, bytes);  // b's endpoint goes
  CHECK(s.open_endpoints() == 2);
  CHECK(s.closed_endpoints() == 1);
  SendTo(s, b, 5, bytes);  // and is made again; a's goes
  CHECK(s.open_endpoints() == 2);
  CHECK(s.closed_endpoints() == 2);
  SendTo(s, c, 6, bytes);  // still open
  CHECK(s.closed_endpoints() == 2);
  // What an operator sees (this test's only serving worker).
  CHECK_THAT(PrometheusText(),
             Catch::Contains("\nptc_transformer_ucx_endpoints 2\n"));
}

TEST_CASE("ucx worker: an endpoint whose send failed is closed",
          "[transformer][ucx]") {
  auto sender = UcxWorker::Create(/*serve=*/true);
  REQUIRE(sender.ok());
  UcxWorker& s = **sender;
  Receiver r;
  // Nobody receives: the rendezvous never completes.
  const std::vector<char> bytes(1 << 20, 'y');
  const UcxWorker::SendOp op{7, bytes.data(), bytes.size()};
  const absl::Status sent = s.Send(r.worker->address(),
                                   absl::MakeConstSpan(&op, 1),
                                   absl::Milliseconds(300));
  CHECK(sent.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(s.open_endpoints() == 0);
  CHECK(s.closed_endpoints() == 1);
  // A later send to that peer gets a fresh endpoint.
  SendTo(s, r, 8, std::vector<char>(4096, 'z'));
  CHECK(s.open_endpoints() == 1);
}

}  // namespace
}  // namespace ptc
