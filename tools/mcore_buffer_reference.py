#!/usr/bin/env python3
"""Megatron-core's own distributed-optimizer buffer layout, as the reference
for ptc's `mcore=1` specs (ptc/testdata/mcore_buffers.json, checked by
tests/python/test_layout_spec.py).

For each case below it starts one CPU process per rank (gloo), builds
Megatron-core's GPTModel for the rank (the local, non-Transformer-Engine
layer spec: TE does not run without a GPU) and wraps it in Megatron-core's
DistributedDataParallel with use_distributed_optimizer=True, exactly as
megatron/training/training.py does (bucket size default and the
overlap_grad_reduce rule included), then writes every
_ParamAndGradBuffer's per-parameter [start, end) and bucket boundaries,
with the parameters named by ptc's keys.

Nothing here is needed at test time: the fixture is committed. To
regenerate it (about 6 minutes on 2 cores; torch from PyPI is ~4 GiB with
its CUDA libraries, which are installed but not used):

    /root/.pyenv/versions/3.11.7/bin/python3 -m venv /tmp/mcvenv   # any Python >= 3.10
    /tmp/mcvenv/bin/pip install torch==2.6.0 megatron-core==0.16.1 numpy packaging
    /tmp/mcvenv/bin/python tools/mcore_buffer_reference.py > ptc/testdata/mcore_buffers.json

Two things are patched, neither in the layout logic: tensors stay on the
CPU (torch.cuda.current_device() -> "cpu", Tensor.cuda() -> the tensor
itself), so the buffers are allocated in host memory. Arguments: case
names to run only those (the output then holds only them).
"""
import json
import math
import os
import re
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MCORE_VERSION = "0.16.1"
# Megatron-LM's --make-vocab-size-divisible-by default
# (megatron/training/arguments.py:1678 at core_v0.16.1).
VOCAB_DIVISIBLE_BY = 128

# Each case: ptc's model text and config, and the same model for Megatron.
#   overlap: DistributedDataParallelConfig.overlap_grad_reduce
#   bucket:  --ddp-bucket-size (None: Megatron's default)
CASES = [
    dict(name="llama_tp2_pp2_dp2",
         model="llama:layers=4,hidden=64,heads=8,kv_heads=4,ffn=96,vocab=1024,mcore=1",
         config="tp=2,pp=2,dp=2,zero=1", overlap=False, bucket=None),
    dict(name="gpt_tp2_dp2_overlap_bucket",
         model="gpt:layers=2,hidden=64,heads=4,vocab=1024,positions=32,mcore=1,"
               "overlap=1,bucket=9000",
         config="tp=2,dp=2,zero=1", overlap=True, bucket=9000),
    dict(name="gpt_dp2_default_bucket_one",
         model="gpt:layers=4,hidden=1024,heads=8,vocab=1024,positions=64,mcore=1",
         config="dp=2,zero=1", overlap=False, bucket=None),
    dict(name="gpt_dp2_overlap_default_bucket_40m",
         model="gpt:layers=4,hidden=1024,heads=8,vocab=1024,positions=64,mcore=1,overlap=1",
         config="dp=2,zero=1", overlap=True, bucket=None),
    dict(name="moe_ep2",
         model="moe:layers=2,hidden=64,heads=4,kv_heads=2,ffn=48,experts=4,shared_ffn=32,"
               "vocab=1024,stacked=0,mcore=1",
         config="ep=2,zero=1", overlap=False, bucket=None),
    dict(name="gpt_tp2_dp2_padded_vocab",
         model="gpt:layers=2,hidden=64,heads=4,vocab=1000,positions=32,mcore=1",
         config="tp=2,dp=2,zero=1", overlap=False, bucket=None),
    dict(name="gpt_pp2_dp2_overlap_later_stages",
         model="gpt:layers=4,hidden=64,heads=4,vocab=1024,positions=32,mcore=1,"
               "overlap=1,bucket=9000",
         config="pp=2,dp=2,zero=1", overlap=True, bucket=9000),
    dict(name="moe_ep1_dp2",
         model="moe:layers=2,hidden=64,heads=4,kv_heads=2,ffn=48,experts=4,shared_ffn=32,"
               "vocab=1024,stacked=0,mcore=1",
         config="dp=2,zero=1", overlap=False, bucket=None),
    # The three together: padding, stages after the first, experts at ep=1.
    dict(name="gpt_tp2_pp2_dp2_padded_vocab_overlap",
         model="gpt:layers=4,hidden=64,heads=4,vocab=1000,positions=32,mcore=1,"
               "overlap=1,bucket=9000",
         config="tp=2,pp=2,dp=2,zero=1", overlap=True, bucket=9000),
    dict(name="llama_tp2_pp2_padded_vocab_untied",
         model="llama:layers=4,hidden=64,heads=8,kv_heads=4,ffn=96,vocab=1000,mcore=1",
         config="tp=2,pp=2,zero=1", overlap=False, bucket=None),
    dict(name="moe_ep1_tp2_pp2_padded_vocab",
         model="moe:layers=2,hidden=64,heads=4,kv_heads=2,ffn=48,experts=4,shared_ffn=32,"
               "vocab=1000,stacked=0,mcore=1",
         config="tp=2,pp=2,zero=1", overlap=False, bucket=None),
]


def parse(text):
    family, _, rest = text.partition(":")
    kv = dict(p.split("=") for p in rest.split(",") if p)
    return family, {k: int(v) if v.lstrip("-").isdigit() else v for k, v in kv.items()}


def config_sizes(text):
    sizes = dict(tp=1, pp=1, dp=1, ep=1)
    for p in text.split(","):
        k, v = p.split("=")
        if k in sizes:
            sizes[k] = int(v)
    return sizes


def ptc_key(name, layer_offset, local_experts_offset, tied):
    """Megatron-core's parameter name -> ptc's tensor key."""
    fixed = {
        "embedding.word_embeddings.weight": "embedding.word.weight",
        "embedding.position_embeddings.weight": "embedding.position.weight",
        "decoder.final_layernorm.weight": "final_norm.weight",
        "decoder.final_layernorm.bias": "final_norm.bias",
        # The tied output weight is the last stage's copy of the embedding.
        "output_layer.weight": "embedding.word.weight" if tied else "output.weight",
    }
    if name in fixed:
        return fixed[name]
    m = re.fullmatch(r"decoder\.layers\.(\d+)\.(.*)", name)
    assert m, name
    layer, rest = layer_offset + int(m.group(1)), m.group(2)
    m2 = re.fullmatch(r"mlp\.experts\.local_experts\.(\d+)\.linear_(fc[12])\.weight", rest)
    if m2:
        return f"layers.{layer}.mlp.experts.{local_experts_offset + int(m2.group(1))}." \
               f"{m2.group(2)}.weight"
    table = {
        "input_layernorm": "attn.norm",
        "self_attention.linear_qkv": "attn.qkv",
        "self_attention.linear_proj": "attn.proj",
        "pre_mlp_layernorm": "mlp.norm",
        "mlp.linear_fc1": "mlp.fc1",
        "mlp.linear_fc2": "mlp.fc2",
        "mlp.router": "mlp.router",
        "mlp.shared_experts.linear_fc1": "mlp.shared.fc1",
        "mlp.shared_experts.linear_fc2": "mlp.shared.fc2",
    }
    module, _, param = rest.rpartition(".")
    assert module in table, name
    return f"layers.{layer}.{table[module]}.{param}"


def run_rank(rank, world, port, case, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = lambda self, *a, **k: self
    dist.init_process_group("gloo", rank=rank, world_size=world)

    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    family, a = parse(case["model"])
    s = config_sizes(case["config"])
    ps.initialize_model_parallel(tensor_model_parallel_size=s["tp"],
                                 pipeline_model_parallel_size=s["pp"],
                                 expert_model_parallel_size=s["ep"])
    gpt, moe = family == "gpt", family == "moe"
    hidden, heads = a["hidden"], a["heads"]
    kw = dict(
        num_layers=a["layers"], hidden_size=hidden, num_attention_heads=heads,
        num_query_groups=heads if gpt else a["kv_heads"],
        tensor_model_parallel_size=s["tp"], pipeline_model_parallel_size=s["pp"],
        expert_model_parallel_size=s["ep"],
        use_cpu_initialization=True, perform_initialization=False,
        params_dtype=torch.bfloat16, bf16=True, pipeline_dtype=torch.bfloat16,
        add_bias_linear=gpt, normalization="LayerNorm" if gpt else "RMSNorm",
        gated_linear_unit=not gpt,
        activation_func=torch.nn.functional.gelu if gpt else torch.nn.functional.silu,
    )
    if gpt:
        kw["ffn_hidden_size"] = a.get("ffn", 4 * hidden)
    elif moe:
        kw.update(ffn_hidden_size=a["ffn"], num_moe_experts=a["experts"],
                  moe_ffn_hidden_size=a["ffn"], moe_router_topk=2,
                  moe_shared_expert_intermediate_size=a.get("shared_ffn") or None)
    else:
        kw["ffn_hidden_size"] = a["ffn"]
    config = TransformerConfig(**kw)
    spec = get_gpt_layer_local_spec(num_experts=a.get("experts") if moe else None,
                                    moe_grouped_gemm=False,
                                    normalization=kw["normalization"])
    # megatron/training/tokenizer/tokenizer.py:117 (_vocab_size_with_padding).
    multiple = VOCAB_DIVISIBLE_BY * s["tp"]
    padded_vocab = int(math.ceil(a["vocab"] / multiple) * multiple)
    pre, post = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    tied = gpt  # ptc's GPT family ties, LLaMA and MoE do not
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=padded_vocab,
                     max_sequence_length=a.get("positions", 128) if gpt else 128,
                     pre_process=pre, post_process=post,
                     share_embeddings_and_output_weights=tied,
                     position_embedding_type="learned_absolute" if gpt else "rope")
    # megatron/training/training.py:1263 (get_model): bf16 models are wrapped
    # in Float16Module, which casts every parameter (the norms too) to bf16,
    # before the DDP wrapper, so all of them share one buffer.
    model = Float16Module(config, model)
    # As megatron/training/training.py (get_model) builds the DDP config.
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True, overlap_grad_reduce=case["overlap"],
        bucket_size=case["bucket"])
    if ddp_config.bucket_size is None:
        ddp_config.bucket_size = max(
            40000000, 1000000 * ps.get_data_parallel_world_size(with_context_parallel=True))
    if not ddp_config.overlap_grad_reduce:
        ddp_config.bucket_size = None
    ddp = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)

    pp_rank = ps.get_pipeline_model_parallel_rank()
    layer_offset = pp_rank * a["layers"] // s["pp"]
    local_experts = (a.get("experts") or 0) // s["ep"]
    experts_offset = ps.get_expert_model_parallel_rank() * local_experts if moe else 0
    names = {p: n.removeprefix("module.") for n, p in model.named_parameters()}
    out = dict(rank=rank, buffers=[])
    for kind, buffers in (("dense", ddp.buffers), ("expert", ddp.expert_parallel_buffers)):
        for buf in buffers:
            params = []
            for p, (start, end, bucket) in buf.param_index_map.items():
                params.append(dict(key=ptc_key(names[p], layer_offset, experts_offset, tied),
                                   megatron=names[p], start=start, end=end, bucket=bucket))
            params.sort(key=lambda e: e["start"])
            out["buffers"].append(dict(
                kind=kind, shards=buf.data_parallel_world_size, numel=buf.numel,
                buckets=[list(b) for b in buf.bucket_indices], params=params))
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


def main():
    only = set(sys.argv[1:])  # case names (default: all)
    cases = []
    for i, case in enumerate(CASES):
        if only and case["name"] not in only:
            continue
        s = config_sizes(case["config"])
        world = s["tp"] * s["pp"] * s["dp"] * s["ep"]
        with tempfile.TemporaryDirectory() as d:
            mp.spawn(run_rank, args=(world, 29500 + i, case, d), nprocs=world)
            ranks = [json.load(open(os.path.join(d, f"{r}.json"))) for r in range(world)]
        cases.append(dict(case, ranks=ranks))
        print(f"{case['name']}: {world} ranks", file=sys.stderr)
    json.dump(dict(megatron_core=MCORE_VERSION, torch=torch.__version__,
                   generator="tools/mcore_buffer_reference.py", cases=cases),
              sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
