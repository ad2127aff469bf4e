"""One rank of the elastic LLaMA-style training job (started by
examples/elastic/run.py): grouped-query attention with Megatron-core's
interleaved qkv, SwiGLU, tensor and pipeline parallelism (GPipe), AdamW
with a warm-up schedule. The lines marked `# ptc` are what ptc asks of the
script.
"""

import pathlib
import sys

import torch

import llama

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "elastic"))
import harness  # noqa: E402
from megatron import Groups, train_step  # noqa: E402

import ptc  # noqa: E402  # ptc
import ptc.torch as pt  # noqa: E402  # ptc

SAMPLES, SEQ = harness.SAMPLES, harness.SEQ


def main():
    args = harness.parse(__doc__)
    arch = llama.Arch(args.model)
    cfg = ptc.ParallelConfig.parse(args.config)
    make_opt = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.01)  # noqa: E731
    layout = llama.layout(arch, torch.optim.AdamW)  # ptc
    if args.layout_out:
        return layout.write(args.layout_out)  # ptc
    harness.init_dist(args, cfg.world_size)
    groups = Groups(cfg, args.rank)
    first_layer, n_layers = cfg.stage_layers(groups.pp_i, arch.layers)
    stage = llama.Stage(arch, cfg.tp, groups.tp_i, first_layer, n_layers, groups.pp_i == 0,
                        groups.pp_i == cfg.pp - 1, groups.tp)
    # The initial values: this rank's cut of the full model's.
    local = pt.shard_state(llama.full_state(arch, args.seed), layout, cfg, args.rank)  # ptc
    with torch.no_grad():
        for name, p in stage.named_parameters():
            p.copy_(local[name])
    opt = make_opt(stage.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: min(1.0, (it + 1) / 4))
    client = harness.client(args)  # ptc.Client(socket, coordinator, job, rank)  # ptc
    cursor = ptc.DataCursor(seed=args.seed, dataset_size=SAMPLES,  # ptc
                            global_batch=args.global_batch)
    iteration = 0
    if args.load:
        extra = pt.load(client, stage, opt, sched)  # ptc
        iteration, cursor = extra.step, extra["cursor"]  # ptc
        harness.check_reload(args, client, stage, opt, iteration)
    data = harness.tokens(arch.vocab)
    while True:
        done, saving = harness.stop(args, iteration)
        if done:
            break
        samples = cursor.next_samples(groups.dp_i, cfg.dp)  # ptc
        if groups.pp_i == 0 and groups.tp_i == 0:
            harness.log_samples(args, iteration, samples)
        loss = train_step(cfg, groups, stage, opt, sched, data[sorted(samples)], SEQ, 2)
        cursor.advance()  # ptc
        iteration += 1
        if stage.last and groups.tp_i == 0 and groups.dp_i == 0:
            harness.log_loss(args, iteration, loss)
    if saving:
        harness.write_aside(args, client, stage, opt)
        pt.save(client, stage, opt, sched, extra={"cursor": cursor}, step=iteration)  # ptc
    harness.finish(args, iteration)


if __name__ == "__main__":
    main()
