"""The loop of one stage process (rank s + 1 of a world of K + 1; rank 0 is
the driver).

    receive the StageSpec, build the stage, report ready
    for each plan from the driver (FIFO):
        stage 0: embed the plan's tokens; else receive [T + 1, D] from stage s - 1
        run the stage's layers over the paged KV cache
        not last: isend hidden + timings to stage s + 1; last: sample, send the result
    with sampled-token feedback (`StageSpec.feedback`): the last stage also
    isends each batch's sampled tokens (and drafts' fate) to every stage
    before it, where a thread queues them for the batches that need them
    (feedback.py)
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .feedback import (END_OF_STREAM, FeedbackReceiver, SampledTokens, TokenInbox,
                       send_message)
from .heartbeat import start_beating
from .lifeline import tie_to_driver
from .plan import BatchPlan
from .stages import build_stage
from .transport import (Groups, Outbox, Times, make_groups, pack_activations, recv_object,
                        unpack_activations)
from .weights import WeightSource
from .worker import StageWorker

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


@dataclass(frozen=True)
class StageSpec:
    """Everything a stage process needs, sent by the driver after init."""

    source: WeightSource
    num_stages: int
    num_blocks: int
    block_size: int
    dtype: str = "float32"
    device: str = "cpu"              # "cpu", or "cuda" (stage s on GPU s mod #GPUs)
    top_p: float = 1.0
    feedback: bool = False           # the stages take running requests' tokens from the last stage


@dataclass(frozen=True)
class StagePlace:
    """Where a stage sits in the pipeline, and what it receives from the one
    before it: `[T + 1, dim]` activations of `dtype`, used on `device`."""
    index: int
    num_stages: int
    dim: int
    dtype: torch.dtype
    device: torch.device

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1


def stage_device(spec: StageSpec, index: int) -> torch.device:
    if spec.device == "cuda":
        return torch.device("cuda", index % torch.cuda.device_count())
    return torch.device(spec.device)


def checkin_key(rank: int) -> str:
    """The store key a stage sets once it has reached the driver's store, so
    the driver can wait for every stage while watching their processes."""
    return f"flightcheck/up/{rank}"


@dataclass(frozen=True)
class StageLaunch:
    """What a spawned stage process is started with: its rank in a world of
    `world_size`, the driver's store (`host`, `port`), the activations'
    backend, the process group's timeout, the file its output goes to, the
    shared array it beats into (heartbeat.py), and whether the driver
    started it from its main thread (then the parent-death signal is safe:
    lifeline.py)."""
    rank: int
    world_size: int
    host: str
    port: int
    act_backend: str
    timeout_s: float
    log_path: str
    heartbeats: Any = None
    from_main_thread: bool = True


def stage_entry(launch: StageLaunch) -> None:
    """Target of a spawned stage process (local launch).

    First it ties itself to the driver (it dies with it, lifeline.py) and
    starts beating (heartbeat.py). The driver alone answers Ctrl-C (it stops
    the stages), so a stage ignores SIGINT: it was started with SIGINT,
    SIGTERM and SIGHUP blocked (stage_processes.py), and a Ctrl-C pending
    since is dropped as it is ignored; SIGTERM and SIGHUP then act as ever.
    A stage's own output (a traceback when a peer dies, gloo's warnings)
    goes to `log_path`, which the driver names when a run fails, instead of
    into the driver's terminal."""
    tie_to_driver(launch.from_main_thread)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    if launch.heartbeats is not None:
        start_beating(launch.heartbeats, launch.rank - 1)
    log_fd = os.open(launch.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    torch.set_num_threads(1)
    timeout = timedelta(seconds=launch.timeout_s)
    store = dist.TCPStore(launch.host, launch.port, launch.world_size, is_master=False,
                          timeout=timeout)
    store.set(checkin_key(launch.rank), str(os.getpid()))
    dist.init_process_group("gloo", store=dist.PrefixStore("default_pg", store), rank=launch.rank,
                            world_size=launch.world_size, timeout=timeout)
    serve_stage(make_groups(launch.act_backend))
    # A clean stop: skip the interpreter's teardown of torch (seconds on a
    # loaded 2-core machine); everything is flushed and the group destroyed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def serve_stage(groups: Groups) -> None:
    """Run this rank's stage until the driver says stop (also under torchrun)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    index, num_stages = rank - 1, world - 1
    outbox = Outbox()
    try:
        _, spec = recv_object(0, groups.meta)
        device = stage_device(spec, index)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        cfg = spec.source.model_config()
        stage = build_stage(cfg, spec.source, index, num_stages, DTYPES[spec.dtype], device)
        worker = StageWorker(stage, spec.num_blocks, spec.block_size, seed=spec.source.seed,
                             top_p=spec.top_p, device=device)
        receiver = _connect_feedback(spec, worker, groups, outbox, index, num_stages, device)
        outbox.send_object(("ready", index, {"layers": list(stage.layer_ids), "pid": os.getpid(),
                                             "kv_bytes": worker.cache.nbytes}), 0, groups.result)
        _loop(worker, groups, outbox, StagePlace(index, num_stages, cfg.dim, DTYPES[spec.dtype], device))
        if spec.feedback and worker.stage.is_last and not worker.stage.is_first:
            assert worker.send_sampled is not None
            worker.send_sampled(SampledTokens(END_OF_STREAM, ()))
        if receiver is not None:
            receiver.join(10.0)
        outbox.send_object(("bye", index, None), 0, groups.result)
        outbox.wait_oldest(0)
    except Exception as err:
        try:
            # Whether this stage broke or only saw a peer break: the driver
            # names the stage that failed first, not the one that noticed.
            outbox.send_object(("error", index, (traceback.format_exc(), is_lost_peer(err))),
                               0, groups.result)
            outbox.wait_oldest(0)
        finally:
            raise
    finally:
        dist.destroy_process_group()


def _connect_feedback(spec: StageSpec, worker: StageWorker, groups: Groups, outbox: Outbox,
                      index: int, num_stages: int,
                      device: torch.device) -> FeedbackReceiver | None:
    """Feedback mode: every stage before the last (ranks 1..K-1) receives
    from the last stage (rank K) in a thread, as vLLM's non-last PP ranks
    all receive its broadcast (stage 0 embeds the tokens and drafts, every
    one takes rejected drafts off its count); the last stage sends to each
    through its outbox. Tensors live on the device for NCCL, in host memory
    for gloo. Returns this stage's receiver."""
    if not spec.feedback:
        return None
    where = device if groups.act_backend != "gloo" else torch.device("cpu")
    receiver = None
    if index < num_stages - 1:
        receiver = FeedbackReceiver(num_stages, groups.feedback, where)

    def send_to_all(message: SampledTokens) -> None:
        for rank in range(1, num_stages):                  # stages 0..K-2
            send_message(outbox, message, rank, groups.feedback, where)

    worker.use_feedback(
        TokenInbox(receiver, keeps_tokens=index == 0) if receiver is not None else None,
        send_to_all if index == num_stages - 1 and num_stages > 1 else None)
    return receiver


def is_lost_peer(err: BaseException) -> bool:
    """A communication error: a peer process died or closed its connection."""
    text = str(err).lower()
    return (isinstance(err, getattr(dist, "DistError", ())) or "gloo" in text
            or "connection" in text or "peer" in text)


def _loop(worker: StageWorker, groups: Groups, outbox: Outbox, place: StagePlace) -> None:
    index, device = place.index, place.device
    gloo_acts = groups.act_backend == "gloo"
    while True:
        _, plan = recv_object(0, groups.meta)
        assert isinstance(plan, BatchPlan)
        if plan.kind == "stop":
            return
        if plan.kind == "reset":
            worker.reset()
            continue
        times: Times = []
        inputs = None
        posted = time.time()
        if not place.is_first:
            buf = torch.empty(plan.num_tokens + 1, place.dim, dtype=place.dtype,
                              device="cpu" if gloo_acts else device)
            posted = time.time()
            dist.recv(buf, src=index, group=groups.act)                # from rank index = stage - 1
            inputs, times = unpack_activations(buf.to(device), index)
        t0 = time.time()
        out = worker.execute(plan, inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((t0, time.time(), posted))
        outbox.wait_oldest(keep=4)                     # bounded: at most a few sends in flight
        if place.is_last:
            outbox.send_object(("result", index, replace(out, stage_times=tuple(times))),
                               0, groups.result)
        else:
            packed = pack_activations(out, times)
            outbox.isend(packed.cpu() if gloo_acts else packed, index + 2, groups.act)
