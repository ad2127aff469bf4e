"""ptc: a training rank's state in ptc.

The client library (ptc._capi: client/c_api.h's libptc.so, bound with
ctypes, so the same build imports in every CPython from 3.9 on) connects to
the host's ptcd and the coordinator:

    import ptc
    client = ptc.Client(socket="/run/ptcd/ptcd.sock", coordinator="coord:7000",
                        job="gpt", rank=rank)
    save = client.begin_save(step)
    for r in client.regions:            # this rank's regions of the layout
        save.write(r["index"], my_shard(r))
    for name in client.small_object_names:
        save.put_small_object(name, my_small_object(name))
    save.commit()

    state = client.load()               # after a reconfiguration
    view = state.region(0)              # read-only numpy view, no copy

A host's launcher asks which ranks to start there, and on which GPUs:

    for r in ptc.ranks_on_host("coord:7000", "gpt", "host3")["ranks"]:
        start(rank=r["rank"], gpu=r["gpu"])   # client.device agrees

A live job's processes follow its changes without restarting
(ptc.torch.elastic, docs/live.md); a host's agent (python3 -m ptc.agent)
starts them, and reports the ones that die (ptc.report_process_exit).

ptc.torch builds a PyTorch job's layout from its modules and a placement
plan, and saves and loads a rank's whole state with one call each
(docs/bring-your-own-model.md); ptc.torch_state is the lower-level mapping
of named tensors to a built-in model's spec.
"""

from ._capi import (  # noqa: F401
    MAX_SMALL_OBJECT_BYTES,
    Client,
    DataCursor,
    Error,
    Follower,
    ParallelConfig,
    Save,
    State,
    model_tensors,
    derived_seed,
    padded_vocab,
    ranks_on_host,
    report_process_exit,
)

__all__ = ["MAX_SMALL_OBJECT_BYTES", "Client", "DataCursor", "Error", "Follower",
           "ParallelConfig", "Save",
           "State", "derived_seed", "model_tensors", "padded_vocab", "ranks_on_host",
           "report_process_exit"]
