"""A flat-buffer distributed optimizer (ZeRO-1), laid out as Megatron-core's
DistributedOptimizer lays out its buffer, on gloo: the model's parameters
are concatenated into buckets of one flat buffer (ptc.torch.flat_buffer
says where each sits and which range of each bucket this rank owns), the
gradients are averaged over the data-parallel group a bucket at a time,
each rank steps the inner optimizer on its ranges only, and the updated
ranges are all-gathered back into every rank's parameters.

The parameters here are fp32, so each owned range is a view of its
parameter (no master copy) and the inner optimizer's state (Adam's moments)
exists only for those ranges: 1/dp of it per rank. ptc.torch.save and load
take this object as the optimizer (its .optimizer and .shards)."""

import torch
import torch.distributed as dist


class DistributedOptimizer:
    reduces_gradients = True  # the training step leaves the dp average to step()

    def __init__(self, model, view, make_optimizer, group):
        """`view`: ptc.torch.flat_buffer(layout, config, rank) for this rank;
        `make_optimizer(tensors)`: the inner torch optimizer; `group`: the
        process group the buffer is split over (data parallelism)."""
        params = dict(model.named_parameters())
        self.view, self.group = view, group
        self.buckets = [(b, [e for e in view.entries if b.start <= e.offset < b.end])
                        for b in view.buckets]
        for b, _ in self.buckets:
            if (b.end - b.start) % view.shards:
                raise ValueError(f"bucket [{b.start}, {b.end}) does not split {view.shards} ways "
                                 "evenly: give the buffer a bucket_pad")
        self.params = {e.name: params[e.name] for e in view.entries}
        # The ranges this rank owns: views of the parameters' memory.
        self.shards = {e.name: self.params[e.name].detach().view(-1)[e.owned[0]:e.owned[1]]
                       for e in view.entries if e.owned}
        self.optimizer = make_optimizer(list(self.shards.values()))

    def zero_grad(self, set_to_none=False):
        for p in self.params.values():
            if p.grad is not None:
                p.grad.zero_()

    def _flat(self, bucket, entries, of):
        flat = torch.zeros(bucket.end - bucket.start)
        for e in entries:
            flat[e.offset - bucket.start:e.offset - bucket.start + e.numel] = \
                of(self.params[e.name]).reshape(-1)[:e.numel]
        return flat

    def step(self):
        n = self.view.shards
        for b, entries in self.buckets:
            # Megatron reduce-scatters; gloo has no reduce_scatter, so the
            # whole bucket is averaged and each rank keeps its chunk.
            grad = self._flat(b, entries, lambda p: p.grad)
            dist.all_reduce(grad, group=self.group)
            grad /= n
            for e in entries:
                if e.owned:
                    at = e.offset - b.start
                    self.shards[e.name].grad = grad[at + e.owned[0]:at + e.owned[1]]
        self.optimizer.step()
        for b, entries in self.buckets:
            flat = self._flat(b, entries, lambda p: p.detach())
            size = (b.end - b.start) // n
            parts = list(flat.split(size))
            mine = parts[self.view.index].clone()
            dist.all_gather(parts, mine, group=self.group)
            with torch.no_grad():
                for e in entries:
                    at = e.offset - b.start
                    self.params[e.name].view(-1)[:e.numel].copy_(flat[at:at + e.numel])
