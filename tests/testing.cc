#include "tests/testing.h"

#include <catch2/catch.hpp>
#include <set>

#include "state_transformer/transformer_service.h"
#include "tools/internal/synthetic.h"

namespace ptc::testing {

DaemonCluster::DaemonCluster(int hosts) {
  for (int h = 0; h < hosts; ++h) {
    auto d = std::make_unique<Daemon>();
    TensorStoreServerOptions options;
    options.socket_path = d->socket_path();
    options.services.push_back(
        [](Store* s) { return std::make_unique<TransformerService>(s); });
    auto server = TensorStoreServer::Start(options);
    REQUIRE(server.ok());
    d->server = std::move(*server);
    d->client = StoreClient::Connect(d->address());
    addresses[h] = d->address();
    daemons.push_back(std::move(d));
  }
}

void SaveSource(DaemonCluster& c, const std::string& job, const PlanScenario& s,
                int64_t version) {
  std::vector<TensorDecl> decls;
  for (const TensorSpec& t : s.spec.tensors)
    decls.push_back({t.key, t.dtype, t.shape});
  for (auto& d : c.daemons) REQUIRE(d->client->Declare(job, decls).ok());
  std::set<std::tuple<int, int, Region>> done;
  std::set<int> hosts;
  for (int t = 0; t < s.source.num_tensors(); ++t) {
    const TensorSpec& ts = s.spec.tensors[t];
    for (const Shard& sh : s.source.shards(t)) {
      const int h = s.source_placement.host[sh.rank];
      hosts.insert(h);
      if (!done.insert({h, t, sh.region}).second) continue;
      const std::vector<char> bytes =
          tools::Synthetic(t, ts.shape, sh.region, ElementSize(ts.dtype));
      REQUIRE(
          c.daemons[h]
              ->client
              ->Put(job, version, ts.key, sh.region, bytes.data(), bytes.size())
              .ok());
    }
  }
  for (int h : hosts) REQUIRE(c.daemons[h]->client->Commit(job, version).ok());
}

void VerifyTarget(DaemonCluster& c, const std::string& job,
                  const PlanScenario& s, int64_t version) {
  for (int t = 0; t < s.target.num_tensors(); ++t) {
    const TensorSpec& ts = s.spec.tensors[t];
    for (const Shard& sh : s.target.shards(t)) {
      const int h = s.target_placement.host[sh.rank];
      const std::vector<char> want =
          tools::Synthetic(t, ts.shape, sh.region, ElementSize(ts.dtype));
      std::vector<char> got(want.size());
      const absl::Status read = c.daemons[h]->client->Read(
          job, version, ts.key, sh.region, got.data(), got.size());
      INFO(ts.key << " " << sh.region.ToString() << " on host " << h << ": "
                  << read.ToString());
      REQUIRE(read.ok());
      REQUIRE(got == want);
    }
  }
}

}  // namespace ptc::testing
