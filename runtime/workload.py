"""Seeded workloads, and the prompt files `flightcheck run --prompts` reads."""

from __future__ import annotations

import json
import random
from pathlib import Path

from .generate import GenerationRequest
from .tokenizer import Tokenizer


def mixed_workload(seed: int, num_requests: int = 12, *, vocab: int = 256,
                   prompt_lens: tuple[int, int] = (3, 60), max_tokens: tuple[int, int] = (4, 12),
                   shared_prefix_fraction: float = 0.4, abort_fraction: float = 0.0,
                   abort_after: tuple[int, int] = (1, 4), arrival_spread: int = 0,
                   repeat_fraction: float = 0.3,
                   temperature: float = 0.0) -> list[GenerationRequest]:
    """Varied prompt lengths; some prompts extend a prefix of an earlier one
    (prefix-cache hits); some repeat a short motif (so prompt lookup finds
    drafts); some requests are aborted after a few output tokens; arrivals
    spread over the first `arrival_spread` engine steps."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    out = []
    for i in range(num_requests):
        length = rng.randint(*prompt_lens)
        if prompts and rng.random() < shared_prefix_fraction:
            base = rng.choice(prompts)
            keep = rng.randint(min(len(base), 8), len(base))
            prompt = base[:keep] + [rng.randrange(vocab) for _ in range(max(1, length - keep))]
        elif rng.random() < repeat_fraction:
            motif = [rng.randrange(vocab) for _ in range(rng.randint(2, 5))]
            prompt = (motif * (length // len(motif) + 1))[:max(length, 2 * len(motif))]
        else:
            prompt = [rng.randrange(vocab) for _ in range(length)]
        prompts.append(prompt)
        abort = rng.randint(*abort_after) if rng.random() < abort_fraction else None
        out.append(GenerationRequest(
            f"r{i}", tuple(prompt), max_tokens=rng.randint(*max_tokens), temperature=temperature,
            abort_after=abort, arrival_step=rng.randint(0, arrival_spread) if arrival_spread else 0))
    return out


class PromptFileError(ValueError):
    pass


def read_prompts(path: str | Path, tokenizer: Tokenizer, default_max_tokens: int,
                 temperature: float = 0.0) -> list[GenerationRequest]:
    """A JSON list, or JSON Lines, of prompts: each a string (tokenized), a
    list of token ids, or an object with "prompt" or "prompt_token_ids" and
    optional "id", "max_tokens", "temperature", "seed", "ignore_eos"."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise PromptFileError(f"cannot read prompts file {path}: {err.strerror}") from None
    try:
        items = json.loads(text) if text.lstrip().startswith("[") else \
            [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise PromptFileError(f"prompts file {path}: not JSON or JSON Lines ({err.msg})") from None
    if not isinstance(items, list) or not items:
        raise PromptFileError(f"prompts file {path}: no prompts")
    out = []
    for i, item in enumerate(items):
        obj = item if isinstance(item, dict) else {"prompt": item}
        raw = obj.get("prompt_token_ids", obj.get("prompt"))
        if isinstance(raw, str):
            ids = tokenizer.encode(raw)
        elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool)
                                                    for t in raw):
            ids = list(raw)
        else:
            raise PromptFileError(f"prompts file {path}: prompt {i} is neither text nor a "
                                  "non-empty list of token ids")
        if not ids:
            raise PromptFileError(f"prompts file {path}: prompt {i} is empty")
        out.append(GenerationRequest(
            str(obj.get("id", f"p{i}")), tuple(ids),
            max_tokens=int(obj.get("max_tokens", default_max_tokens)),
            temperature=float(obj.get("temperature", temperature)), seed=obj.get("seed"),
            ignore_eos=bool(obj.get("ignore_eos", False))))
    return out
