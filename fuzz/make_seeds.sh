#!/usr/bin/env bash
# Writes the seed inputs of fuzz/corpus/*/seed-* from the text-format
# requests below (protoc --encode); run it after changing them. Inputs that
# name an RPC start with its selector byte (see each *_fuzzer.cc).
set -euo pipefail
cd "$(dirname "$0")/.."
seed() {  # TARGET NAME SELECTOR(-1: none) MESSAGE-TYPE FILE TEXT
  local out="fuzz/corpus/$1/seed-$2"
  {
    [[ $3 -ge 0 ]] && printf "\\x$(printf %02x "$3")"
    echo "$6" | protoc -I. --encode="ptc.proto.$4" "$5"
  } >"$out"
}
seed fragment good -1 ExecuteFragmentRequest proto/transformer.proto '
job: "j" source_version: 1 target_version: 2 plan_epoch: 1 host: 0
tensors { key: "w" dtype: "fp32" shape: [8, 8] }
fragment { host: 0 holds { tensor: 0 region { dims { begin: 0 end: 8 } dims { begin: 0 end: 4 } } }
           transfers { tensor: 0 source_host: 1 region { dims { begin: 0 end: 8 } dims { begin: 0 end: 4 } } } }
parallel_pulls: 4'
seed fragment gap -1 ExecuteFragmentRequest proto/transformer.proto '
job: "j" source_version: 1 target_version: 2 plan_epoch: 1 host: 0
tensors { key: "w" dtype: "fp32" shape: [8, 8] }
fragment { host: 0 holds { tensor: 0 region { dims { begin: 0 end: 8 } dims { begin: 0 end: 8 } } }
           transfers { tensor: 0 source_host: 1 region { dims { begin: 0 end: 8 } dims { begin: 0 end: 4 } } } }'
seed fragment rank -1 ExecuteFragmentRequest proto/transformer.proto '
job: "j" host: 0 tensors { key: "w" dtype: "fp32" shape: [8, 8] }
fragment { host: 0 holds { tensor: 0 region { dims { begin: 0 end: 8 } } } }'
seed store declare 0 DeclareTensorsRequest proto/tensor_store.proto '
job: "job" tensors { key: "b" dtype: "bf16" shape: [4, 1024] }'
seed store stat 1 StatRequest proto/tensor_store.proto 'job: "job" version: 1 tensor: "w"'
seed store fingerprint 2 FingerprintRequest proto/tensor_store.proto '
job: "job" version: 1 tensor: "w" regions { dims { begin: 0 end: 16 } dims { begin: 0 end: 8 } }'
seed store commit 3 CommitVersionRequest proto/tensor_store.proto '
job: "job" version: 1 expect_regions { tensor: "w" region { dims { begin: 0 end: 16 } dims { begin: 0 end: 16 } } }'
seed store small 4 PutSmallObjectRequest proto/tensor_store.proto '
job: "job" version: 2 name: "rng" rank: 0 data: "abc"'
seed store small-objects 8 GetSmallObjectsRequest proto/tensor_store.proto '
job: "job" version: 1 objects { name: "rng" rank: 0 } objects { name: "rng" rank: 1 }'
seed store prepare 6 PrepareMemoryRequest proto/tensor_store.proto '
job: "job" version: 3 sizes: [4096, 65536]'
seed local hello -1 LocalRequest proto/local.proto 'request_id: 1 hello { job: "job" }'
seed local map -1 LocalRequest proto/local.proto '
request_id: 2 map { job: "job" version: 1 tensor: "w" region { dims { begin: 0 end: 16 } dims { begin: 0 end: 16 } } }'
seed local put -1 LocalRequest proto/local.proto '
request_id: 3 allocate_put { job: "job" version: 2 tensor: "w" region { dims { begin: 0 end: 8 } dims { begin: 0 end: 16 } } }'
seed local declare -1 LocalRequest proto/local.proto '
request_id: 4 declare { job: "job" tensors { key: "v" dtype: "fp16" shape: [3] } }'
seed local map-many -1 LocalRequest proto/local.proto '
request_id: 5 map_many { job: "job" version: 1
  items { tensor: "w" region { dims { begin: 0 end: 16 } dims { begin: 0 end: 16 } } }
  items { tensor: "w" region { dims { begin: 0 end: 16 } dims { begin: 0 end: 16 } } } }'
seed local release-many -1 LocalRequest proto/local.proto '
request_id: 6 release { leases: [1, 2, 3] }'
seed coordinator host 0 RegisterHostRequest proto/coordinator.proto '
host { name: "host2" address: "127.0.0.1:3" gpus: 8 bandwidth: 25e9 memory_bytes: 1073741824 }'
seed coordinator job 2 RegisterJobRequest proto/coordinator.proto '
job: "k" model: "gpt:layers=2,hidden=16,heads=2,ffn=32,vocab=64,positions=8"
config: "tp=2" hosts: ["host0", "host1"]'
seed coordinator save 3 BeginSaveRequest proto/coordinator.proto 'job: "j" rank: 1 step: 7'
seed coordinator list 4 ListJobsRequest proto/coordinator.proto 'job: "j" include_layout: true'
seed coordinator advise 6 AdviseRequest proto/coordinator.proto 'job: "j" gpus: 4'
seed coordinator auto 7 SetAutoPolicyRequest proto/coordinator.proto '
job: "j" policy { enabled: true live: true pinned_config: "tp=2,dp=1" margin: 0.1 global_batch: 16 }'
seed coordinator drain 8 ChangeHostsRequest proto/coordinator.proto 'op: OP_DRAIN hosts: ["host1"]'
seed coordinator meet 9 RendezvousRequest proto/coordinator.proto 'job: "j" layout_epoch: 1 rank: 0 port: 4000'
seed coordinator exit 10 ReportProcessExitRequest proto/coordinator.proto '
job: "j" host: "host0" gpu: 1 exit_code: -9 layout_epoch: 1'
