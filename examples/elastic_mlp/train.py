"""A plain MLP classifier under data parallelism that keeps its state in
ptc: AdamW, a warm-up + cosine LR schedule, a data-loader cursor. The
lines marked `# ptc` are all it takes; the rest is ordinary PyTorch (and
the launcher's harness, which proves each change)."""

import sys
import pathlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "elastic"))
import harness  # noqa: E402

import ptc  # noqa: E402  # ptc
import ptc.torch as pt  # noqa: E402  # ptc

DIM, HIDDEN, CLASSES, SAMPLES = 32, 256, 10, 8192


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(DIM, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.out(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def dataset(seed=7):
    """Inputs and the labels a fixed random teacher gives them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, DIM, generator=g)
    w = torch.randn(DIM, CLASSES, generator=g)
    return x, (x @ w + 0.5 * torch.randn(SAMPLES, CLASSES, generator=g)).argmax(dim=1)


def schedule(step):
    return min(1.0, (step + 1) / 5) * 0.5 * (1 + torch.cos(torch.tensor(step / 200 * 3.14159)))


def main():
    args = harness.parse(__doc__)
    dp = ptc.ParallelConfig.parse(args.config).dp  # ptc
    torch.manual_seed(args.seed)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: float(schedule(s)))
    if args.layout_out:
        return pt.Layout(model, optimizer=opt).write(args.layout_out)  # ptc
    harness.init_dist(args, dp)
    client = harness.client(args)  # ptc.Client(socket, coordinator, job, rank)  # ptc
    cursor = ptc.DataCursor(seed=args.seed, dataset_size=SAMPLES,  # ptc
                            global_batch=args.global_batch)
    step = 0
    if args.load:
        extra = pt.load(client, model, opt, sched)  # ptc
        cursor, step = extra["cursor"], extra.step  # ptc
        harness.check_reload(args, client, model, opt, step)
    x, y = dataset()
    while True:
        done, save = harness.stop(args, step)
        if done:
            break
        ids = cursor.next_samples(args.rank, dp)  # ptc
        harness.log_samples(args, step, ids)
        loss = F.cross_entropy(model(x[ids]), y[ids])
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # data parallelism: average the gradients
            dist.all_reduce(p.grad)
            p.grad /= dp
        opt.step()
        sched.step()
        cursor.advance()  # ptc
        step += 1
        total = loss.detach().clone()
        dist.all_reduce(total)
        if args.rank == 0:
            harness.log_loss(args, step, total.item() / dp)
    if save:
        harness.write_aside(args, client, model, opt)
        pt.save(client, model, opt, sched, extra={"cursor": cursor}, step=step)  # ptc
    harness.finish(args, step)


if __name__ == "__main__":
    main()
