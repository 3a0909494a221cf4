"""Dataset loaders with vLLM benchmark_serving's selection rules.

* BurstGPT CSV (`Timestamp, Model, Request tokens, Response tokens, Total
  tokens, Log Type`; the "without fails" files): like vLLM's loader, keep
  rows with `Model == "GPT-4"` and `Response tokens > 0`, then sample
  `num_prompts` rows with the seed. vLLM samples with pandas
  (`DataFrame.sample(random_state=seed)`); we use Python's `random`, so the
  same seed picks different rows than vLLM does (the statistics agree).
  The trace's timestamps are not used: vLLM's BurstGPT runs use synthetic
  arrivals too.
* ShareGPT JSON: the first human turn is the prompt, the first reply's
  length is the output length; pairs with prompt or output under 4 tokens,
  prompt over 1024 or prompt + output over 2048 are dropped
  (`is_valid_sequence`). We have no tokenizer here (no transformers in the
  core), so a text's length in tokens is estimated as characters / 4, the
  usual rule of thumb for English BPE vocabularies.
* Random: every prompt `input_len` and every output `output_len` tokens,
  or uniform in `[L*(1-r), L*(1+r)]` with `range_ratio` r (vLLM >= 0.9).
"""

from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

from .workload import RequestSpec, Workload, WorkloadError

BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens",
                    "Total tokens", "Log Type")


# A dataset file is read in this many bytes at most: ShareGPT's usual file
# (ShareGPT_V3_unfiltered_cleaned_split.json) is 642 MB, BurstGPT's CSVs less.
MAX_DATASET_BYTES = 1024 * 2**20
# Token counts in a dataset row: vLLM holds them in int32.
MAX_ROW_TOKENS = 2**31 - 1


def _lines(path: str | Path):
    """The dataset's lines, read with the bounds of flightcheck/input_files.py."""
    from flightcheck.input_files import InputFileError, text_lines

    if not Path(path).exists():
        raise WorkloadError(f"dataset file not found: {path}")
    try:
        yield from text_lines(path, MAX_DATASET_BYTES, "dataset file")
    except InputFileError as err:
        raise WorkloadError(str(err)) from None


def _int_field(row: dict, column: str, path: str | Path, line: int) -> int:
    text = row.get(column)
    try:
        value = float(text)               # some exports write "417.0"
    except (TypeError, ValueError):
        raise WorkloadError(f"{path}:{line}: column {column!r} is not a number: {text!r}") from None
    if not math.isfinite(value) or not -1 < value <= MAX_ROW_TOKENS:
        shown = text if len(text) <= 24 else text[:20] + "..."
        raise WorkloadError(f"{path}:{line}: column {column!r} must be a count from 0 to "
                            f"{MAX_ROW_TOKENS}, got {shown!r}")
    return int(value)


def read_burstgpt_rows(path: str | Path, model: str = "GPT-4") -> list[tuple[int, int]]:
    """(request tokens, response tokens) of every row of `model` with a
    positive response, in file order. Malformed rows raise, naming the line."""
    reader = csv.DictReader(_lines(path))
    try:
        return _burstgpt_rows(reader, path, model)
    except csv.Error as err:              # a NUL byte, a field past csv.field_size_limit()
        raise WorkloadError(f"{path}:{reader.line_num}: not a CSV row ({err})") from None


def _burstgpt_rows(reader: csv.DictReader, path: str | Path, model: str) -> list[tuple[int, int]]:
    header = reader.fieldnames or []
    missing = [c for c in ("Model", "Request tokens", "Response tokens") if c not in header]
    if missing:
        raise WorkloadError(f"{path}:1: not a BurstGPT CSV: missing column(s) "
                            f"{', '.join(missing)}; expected {', '.join(BURSTGPT_COLUMNS)}")
    rows: list[tuple[int, int]] = []
    for row in reader:
        line = reader.line_num
        if None in row or any(v is None for v in row.values()):
            raise WorkloadError(f"{path}:{line}: expected {len(header)} fields")
        if row["Model"] != model:
            continue
        request_tokens = _int_field(row, "Request tokens", path, line)
        response_tokens = _int_field(row, "Response tokens", path, line)
        if response_tokens > 0 and request_tokens > 0:
            rows.append((request_tokens, response_tokens))
    if not rows:
        raise WorkloadError(f"{path}: no {model} rows with Response tokens > 0")
    return rows


def load_burstgpt_csv(path: str | Path, num_prompts: int, seed: int) -> Workload:
    rows = read_burstgpt_rows(path)
    rng = random.Random(seed)
    # vLLM samples with replacement only when asked for more rows than exist.
    picked = rng.sample(rows, num_prompts) if num_prompts <= len(rows) \
        else [rng.choice(rows) for _ in range(num_prompts)]
    return Workload(f"burstgpt:{path}", tuple(
        RequestSpec(f"r{i}", p, o) for i, (p, o) in enumerate(picked)))


def approx_num_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def load_sharegpt_json(path: str | Path, num_prompts: int, seed: int,
                       output_len: int | None = None) -> Workload:
    from flightcheck.input_files import InputFileError, parse_json

    text = "".join(_lines(path))
    try:
        data = parse_json(text, str(path))
    except json.JSONDecodeError as err:
        raise WorkloadError(f"{path}:{err.lineno}: not valid JSON: {err.msg}") from None
    except InputFileError as err:
        raise WorkloadError(str(err)) from None
    if not isinstance(data, list):
        raise WorkloadError(f"{path}: expected a JSON list of conversations")
    pairs: list[tuple[int, int]] = []
    for index, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue                          # vLLM skips conversations with fewer than 2 turns
        try:
            prompt, reply = str(turns[0]["value"]), str(turns[1]["value"])
        except (KeyError, TypeError):
            raise WorkloadError(f"{path}: conversation {index}: turns need a 'value'") from None
        p = approx_num_tokens(prompt)
        o = output_len if output_len is not None else approx_num_tokens(reply)
        if p < 4 or o < 4 or p > 1024 or p + o > 2048:
            continue
        pairs.append((p, o))
    if len(pairs) < num_prompts:
        raise WorkloadError(f"{path}: only {len(pairs)} valid conversations, "
                            f"--num-prompts asks for {num_prompts}")
    random.Random(seed).shuffle(pairs)
    return Workload(f"sharegpt:{path}", tuple(
        RequestSpec(f"r{i}", p, o) for i, (p, o) in enumerate(pairs[:num_prompts])))


def random_lengths(num_prompts: int, input_len: int, output_len: int, seed: int,
                   range_ratio: float = 0.0) -> Workload:
    if input_len < 1 or output_len < 1:
        raise WorkloadError(f"--random-input-len and --random-output-len must be >= 1, "
                            f"got {input_len} and {output_len}")
    if not 0.0 <= range_ratio < 1.0:
        raise WorkloadError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = random.Random(seed)

    def draw(length: int) -> int:
        low, high = math.floor(length * (1 - range_ratio)), math.ceil(length * (1 + range_ratio))
        return max(1, rng.randint(low, high)) if high > low else length

    return Workload("random", tuple(RequestSpec(f"r{i}", draw(input_len), draw(output_len))
                                    for i in range(num_prompts)))
