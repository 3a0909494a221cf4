"""Point-to-point messages over torch.distributed, shaped by what gloo does on
these machines (docs/pipeline-facts.md §"Gloo on a small shared machine"): `send` is a rendezvous (it blocks until the peer
posts its `recv`), `irecv().is_completed()` cannot be polled, and
`send_object_list` needs numpy. So every send is an `isend` whose tensors
are kept alive until its `Work` is waited on, every receive is a blocking
`recv` in FIFO order, and objects are pickled into uint8 tensors by hand.

Three process groups, so the streams never share a gloo context:
* `meta`: driver (rank 0) -> every stage: pickled `BatchPlan`s;
* `result`: stages -> driver: pickled messages (ready, result, error, bye);
* `act`: stage s -> stage s+1: activations (gloo, or NCCL between GPUs);
* `feedback`: last stage -> stage 0: sampled tokens (feedback.py; int64
  tensors only, on the activations' backend).
"""

from __future__ import annotations

import pickle
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class Groups:
    meta: Any
    result: Any
    act: Any
    act_backend: str
    feedback: Any = None


def make_groups(act_backend: str) -> Groups:
    """Called by every rank, in the same order, after init_process_group."""
    world = dist.group.WORLD
    result = dist.new_group(backend="gloo")
    act = world if act_backend == "gloo" else dist.new_group(backend=act_backend)
    feedback = dist.new_group(backend=act_backend)
    return Groups(world, result, act, act_backend, feedback)


class Outbox:
    """Pending isends; tensors live until their Work is waited on."""

    def __init__(self) -> None:
        self._pending: deque[tuple[Any, tuple[Tensor, ...]]] = deque()

    def isend(self, tensor: Tensor, dst: int, group: Any) -> None:
        self._pending.append((dist.isend(tensor, dst=dst, group=group), (tensor,)))

    def send_object(self, obj: Any, dst: int, group: Any) -> None:
        payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)),
                                   dtype=torch.uint8)
        header = torch.tensor([payload.numel()], dtype=torch.int64)
        self.isend(header, dst, group)
        self.isend(payload, dst, group)

    def wait_oldest(self, keep: int = 0) -> None:
        """Wait until at most `keep` sends are pending (oldest first)."""
        while len(self._pending) > keep:
            work, _ = self._pending.popleft()
            work.wait()

    def __len__(self) -> int:
        return len(self._pending)


def recv_object(src: int | None, group: Any) -> tuple[int, Any]:
    """Blocking; src=None receives from any rank. Returns (sender, object)."""
    header = torch.empty(1, dtype=torch.int64)
    sender = dist.recv(header, src=src, group=group)
    payload = torch.empty(int(header[0]), dtype=torch.uint8)
    dist.recv(payload, src=sender, group=group)
    return sender, pickle.loads(_to_bytes(payload))


def _to_bytes(t: Tensor) -> bytes:
    # Without numpy: a uint8 tensor's storage, copied out through a bytearray.
    out = bytearray(t.numel())
    torch.frombuffer(out, dtype=torch.uint8).copy_(t)
    return bytes(out)


# -- activations with their stage timings --------------------------------------

Times = list[tuple[float, float, float]]   # per stage: (t0, t1, recv posted)


def pack_activations(hidden: Tensor, times: Times) -> Tensor:
    """[T, D] hidden states + the timestamps of each stage so far, bitcast
    into one extra row: one message per hop, whatever the activation dtype."""
    T, D = hidden.shape
    raw = torch.tensor([x for triple in times for x in triple], dtype=torch.float64).view(torch.uint8)
    row_bytes = D * hidden.element_size()
    if raw.numel() > row_bytes:
        raise ValueError(f"stage timings need {raw.numel()} bytes, one row holds {row_bytes}")
    row = torch.zeros(row_bytes, dtype=torch.uint8)
    row[:raw.numel()] = raw
    extra = row.view(hidden.dtype).to(hidden.device)[None, :]                 # [1, D]
    return torch.cat([hidden, extra]).contiguous()                            # [T + 1, D]


def unpack_activations(buf: Tensor, num_stages_before: int) -> tuple[Tensor, Times]:
    """[T + 1, D] -> hidden [T, D] and the timestamps of the stages before."""
    raw = buf[-1].cpu().contiguous().view(torch.uint8)[:24 * num_stages_before]
    flat = raw.view(torch.float64).tolist()
    return buf[:-1], [tuple(flat[3 * i:3 * i + 3]) for i in range(num_stages_before)]
