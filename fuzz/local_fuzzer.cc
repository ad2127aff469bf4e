// The local socket as a training process on the host reaches it: each input
// is one packet to a real LocalServer (frame, LocalRequest parsing, every
// operation against a real store). The daemon must answer every packet and
// never crash; a connection is replaced every 64 inputs, which also
// releases what earlier inputs allocated or mapped.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "fuzz/fuzz.h"
#include "fuzz/store_seed.h"
#include "tensor_store/internal/unix_socket.h"
#include "tensor_store/local_server.h"
#include "tensor_store/store.h"

namespace ptc::fuzz {
namespace {

struct Daemon {
  Daemon() : store(StoreOptions{kFuzzStoreBytes, 0, false}) {
    char dir[] = "/tmp/ptc-local-fuzz-XXXXXX";
    if (mkdtemp(dir) == nullptr) std::abort();
    LocalServerOptions options;
    options.socket_path = std::string(dir) + "/ptcd.sock";
    auto s = LocalServer::Start(&store, options);
    if (!s.ok()) std::abort();
    server = *std::move(s);
    path = options.socket_path;
    SeedStore(store);
  }
  Store store;
  std::unique_ptr<LocalServer> server;
  std::string path;
};

int Connect(const std::string& path) {
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<struct sockaddr*>(&addr),
                        sizeof(addr)) != 0) {
    std::abort();  // the daemon stopped accepting
  }
  return fd;
}

}  // namespace
}  // namespace ptc::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = ptc::fuzz::QuietProtobuf();
  (void)quiet;
  using namespace ptc;
  static fuzz::Daemon* d = new fuzz::Daemon;
  static int fd = -1;
  static int uses = 0;
  // An empty packet reads as the client leaving; nothing to answer.
  if (size == 0) return 0;
  if (fd < 0 || ++uses % 64 == 0) {
    if (fd >= 0) close(fd);
    fd = fuzz::Connect(d->path);
  }
  // Raw bytes as one packet, as a hostile client could send them.
  if (!store_internal::SendPacket(
           fd, std::string(reinterpret_cast<const char*>(data), size))
           .ok()) {
    close(fd);  // too large for a packet: the client's own error
    fd = -1;
    return 0;
  }
  int passed = -1;
  auto answer = store_internal::ReceivePacket(fd, &passed);
  if (passed >= 0) close(passed);
  if (!answer.ok()) {  // every packet gets an answer
    std::fprintf(stderr, "local_fuzzer: no answer: %s\n",
                 answer.status().ToString().c_str());
    std::abort();
  }
  return 0;
}
