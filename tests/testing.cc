#include "tests/testing.h"

#include <catch2/catch.hpp>
#include <set>

#include "ptc/small_object.h"
#include "state_transformer/transformer_service.h"
#include "tools/internal/synthetic.h"

namespace ptc::testing {

DaemonCluster::DaemonCluster(int hosts, int64_t spare_pool) {
  for (int h = 0; h < hosts; ++h) {
    auto d = std::make_unique<Daemon>();
    TensorStoreServerOptions options;
    options.socket_path = d->socket_path();
    options.host_name = "host" + std::to_string(h);
    options.spare_pool_bytes = spare_pool;
    options.services.push_back(
        [admissions = options.peer_admissions](Store* s) {
          return std::make_unique<TransformerService>(
              s, TransformerOptions(), admissions);
        });
    auto server = TensorStoreServer::Start(options);
    REQUIRE(server.ok());
    d->server = std::move(*server);
    d->client = StoreClient::Connect(d->address());
    addresses[h] = d->address();
    daemons.push_back(std::move(d));
  }
}

proto::CoordinatorState KnownHosts(const DaemonCluster& c, int gpus) {
  proto::CoordinatorState state;
  for (const auto& [h, address] : c.addresses) {
    proto::HostStatus* s = state.add_hosts();
    s->set_name("host" + std::to_string(h));
    s->set_address(address);
    s->set_gpus(gpus);
    s->set_alive(true);
  }
  return state;
}

SmallObjects SaveSource(DaemonCluster& c, const std::string& job,
                        const PlanScenario& s, int64_t version) {
  std::vector<TensorDecl> decls;
  for (const TensorSpec& t : s.spec.tensors)
    decls.push_back({t.key, t.dtype, t.shape});
  for (auto& d : c.daemons) REQUIRE(d->client->Declare(job, decls).ok());
  std::set<std::tuple<int, int, Region>> done;
  std::set<int> hosts;
  for (int t = 0; t < s.source().num_tensors(); ++t) {
    const TensorSpec& ts = s.spec.tensors[t];
    for (const Shard& sh : s.source().shards(t)) {
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
  SmallObjects small;
  for (int rank = 0; rank < s.source().world_size(); ++rank) {
    const int h = s.source_placement.host[rank];
    for (const SmallObjectSpec& o : s.spec.small_objects) {
      const std::string bytes = tools::SyntheticSmallObject(o.name, rank);
      REQUIRE(c.daemons[h]
                  ->client->PutSmallObject(job, version, o.name, rank, bytes)
                  .ok());
      small[{o.name, rank}] = bytes;
    }
  }
  for (int h : hosts) REQUIRE(c.daemons[h]->client->Commit(job, version).ok());
  return small;
}

SmallObjects AfterPlan(const std::string& job, const SmallObjects& before,
                       const Plan& plan, int64_t target_version) {
  SmallObjects after;
  for (const SmallObjectMove& m : plan.small_objects) {
    after[{m.name, m.target_rank}] =
        m.derive_from.empty()
            ? before.at({m.name, m.source_rank})
            : DerivedSmallObject(job, m.name, m.derive_from, target_version);
  }
  return after;
}

void VerifyTarget(DaemonCluster& c, const std::string& job,
                  const PlanScenario& s, int64_t version,
                  const SmallObjects* small) {
  if (small != nullptr) {
    REQUIRE(small->size() ==
            s.spec.small_objects.size() * s.target().world_size());
    for (const auto& [key, want] : *small) {
      const int h = s.target_placement.host[key.second];
      auto got = c.daemons[h]->client->GetSmallObject(job, version, key.first,
                                                      key.second);
      INFO("small object " << key.first << " of rank " << key.second
                           << " on host " << h);
      REQUIRE(got.ok());
      CHECK(*got == want);
    }
  }
  for (int t = 0; t < s.target().num_tensors(); ++t) {
    const TensorSpec& ts = s.spec.tensors[t];
    for (const Shard& sh : s.target().shards(t)) {
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
