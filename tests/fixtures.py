"""Setup shared by several test modules, in one place.

`dense_oracle` is what the runtime differential tests compare against: the
outputs a dense (unpaged, unbatched) greedy decode of the same seeded model
gives for a workload, cut at an EOS id the model really emits, so that some
requests stop early. Each test module binds it to its own workload in a
module-scoped fixture (`oracle`), built once per module.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any


def dense_oracle(source: Any, workload: Sequence[Any], max_model_len: int) -> tuple[int, dict[str, list[int]]]:
    """An EOS id the model emits (so some requests stop) and the dense greedy
    outputs of every request of `workload`, each cut after that EOS."""
    import torch

    from flightcheck.runtime import build_model
    from flightcheck.runtime.dense import dense_greedy

    model = build_model(source.model_config(), source, torch.float64)
    free = {g.req_id: dense_greedy(model, g.prompt_token_ids, g.max_tokens, None, max_model_len)
            for g in workload}
    counts = collections.Counter(t for out in free.values() for t in out[1:-1])
    eos = counts.most_common(1)[0][0]
    return eos, {r: out[:out.index(eos) + 1] if eos in out else out for r, out in free.items()}
