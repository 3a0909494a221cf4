"""Seeded workloads, and the prompt files `flightcheck run --prompts` reads."""

from __future__ import annotations

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


# A prompts file is read whole: at most this many bytes and prompts (the
# prompts' count is --num-prompts' limit: flightcheck/commands/common.py).
MAX_PROMPTS_FILE_BYTES = 64 * 2**20
MAX_PROMPTS_IN_FILE = 100_000
MAX_SAMPLING_SEED = 2**63 - 1          # the sampler mixes it modulo 2**63
MAX_TOKENS = 2**31 - 1


def read_prompts(path: str | Path, tokenizer: Tokenizer, default_max_tokens: int,
                 temperature: float = 0.0) -> list[GenerationRequest]:
    """A JSON list, or JSON Lines, of prompts: each a string (tokenized), a
    list of token ids, or an object with "prompt" or "prompt_token_ids" and
    optional "id", "max_tokens", "temperature", "seed", "ignore_eos".
    PromptFileError, one line naming the file (and the line or prompt), for
    a file that is not a regular file, is larger than
    MAX_PROMPTS_FILE_BYTES, is not UTF-8 or not such JSON."""
    from flightcheck.input_files import InputFileError, read_text

    try:
        text = read_text(path, MAX_PROMPTS_FILE_BYTES, "prompts file")
        items = _parse_prompts(text, str(path))
    except InputFileError as err:
        raise PromptFileError(str(err)) from None
    if not isinstance(items, list) or not items:
        raise PromptFileError(f"prompts file {path}: no prompts")
    if len(items) > MAX_PROMPTS_IN_FILE:
        raise PromptFileError(f"prompts file {path}: {len(items)} prompts, more than the "
                              f"{MAX_PROMPTS_IN_FILE} a run takes")
    return [_prompt(item, i, path, tokenizer, default_max_tokens, temperature) for i, item in enumerate(items)]


def _parse_prompts(text: str, path: str) -> object:
    """A JSON list (text starting with "["), else JSON Lines, blank lines skipped."""
    import json

    from flightcheck.input_files import json_lines, parse_json

    if text.lstrip().startswith("["):
        try:
            return parse_json(text, f"prompts file {path}")
        except json.JSONDecodeError as err:
            raise PromptFileError(f"prompts file {path}:{err.lineno}: not JSON ({err.msg})") from None
    return json_lines(text, f"prompts file {path}")


def _prompt(item: object, i: int, path: str | Path, tokenizer: Tokenizer, default_max_tokens: int,
            temperature: float) -> GenerationRequest:
    obj = item if isinstance(item, dict) else {"prompt": item}
    where = f"prompts file {path}: prompt {i}"
    raw = obj.get("prompt_token_ids", obj.get("prompt"))
    if isinstance(raw, str):
        ids = tokenizer.encode(raw)
    elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool)
                                                for t in raw):
        ids = list(raw)
    else:
        raise PromptFileError(f"{where} is neither text nor a non-empty list of token ids")
    if not ids:
        raise PromptFileError(f"{where} is empty")
    req_id = obj.get("id", f"p{i}")
    if not isinstance(req_id, (str, int)) or isinstance(req_id, bool):
        raise PromptFileError(f"{where}: id must be a string or an integer")
    return GenerationRequest(
        str(req_id), tuple(ids),
        max_tokens=_whole(obj, "max_tokens", default_max_tokens, 1, MAX_TOKENS, where),
        temperature=_temperature(obj.get("temperature", temperature), where),
        seed=None if obj.get("seed") is None else _whole(obj, "seed", 0, 0, MAX_SAMPLING_SEED, where),
        ignore_eos=_flag(obj.get("ignore_eos", False), where))


def _whole(obj: dict, key: str, default: int, low: int, high: int, where: str) -> int:
    value = obj.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise PromptFileError(f"{where}: {key} must be an integer from {low} to {high}")
    return value


def _temperature(value: object, where: str) -> float:
    """A finite number >= 0 (below sampler.GREEDY_BELOW: greedy)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1e6:
        raise PromptFileError(f"{where}: temperature must be a number from 0 to 1e6")
    return float(value)


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise PromptFileError(f"{where}: ignore_eos must be true or false")
    return value
