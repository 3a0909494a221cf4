"""What the user asked for (dataset, rate, burstiness, prompts), turned into a
seeded `Workload` with send times; shared by `simulate` and `bench`."""

from __future__ import annotations

from dataclasses import dataclass

from .arrivals import send_times
from .burstgpt_synth import synthetic_burstgpt
from .datasets import load_burstgpt_csv, load_sharegpt_json, random_lengths
from .workload import Workload, WorkloadError

DATASETS = ("burstgpt", "sharegpt", "random")


@dataclass(frozen=True)
class WorkloadArgs:
    dataset: str = "burstgpt"
    dataset_path: str | None = None
    num_prompts: int = 150
    request_rate: float = 2.0
    burstiness: float = 1.0
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    sharegpt_output_len: int | None = None
    max_model_len: int = 16384

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise WorkloadError(f"unknown --dataset {self.dataset!r}; known: {', '.join(DATASETS)}")
        if self.num_prompts < 1:
            raise WorkloadError(f"--num-prompts must be at least 1, got {self.num_prompts}")
        if self.dataset == "sharegpt" and not self.dataset_path:
            raise WorkloadError("--dataset sharegpt needs --dataset-path (a ShareGPT JSON file)")


def build_workload(args: WorkloadArgs, seed: int) -> Workload:
    if args.dataset == "burstgpt":
        workload = (load_burstgpt_csv(args.dataset_path, args.num_prompts, seed)
                    if args.dataset_path else
                    synthetic_burstgpt(args.num_prompts, seed, args.max_model_len))
    elif args.dataset == "sharegpt":
        assert args.dataset_path is not None
        workload = load_sharegpt_json(args.dataset_path, args.num_prompts, seed,
                                      args.sharegpt_output_len)
    else:
        workload = random_lengths(args.num_prompts, args.random_input_len, args.random_output_len,
                                  seed, args.random_range_ratio)
    times = send_times(args.num_prompts, args.request_rate, args.burstiness, seed)
    return workload.with_send_times(times)
