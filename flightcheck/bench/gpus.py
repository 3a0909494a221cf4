"""Accelerator datasheet figures the roofline needs.

`peak_bf16_flops` is dense (no 2:4 sparsity) tensor-core throughput;
`mem_bandwidth` the HBM/GDDR bandwidth; `link_bandwidth` what one
stage-to-stage transfer can expect (PCIe Gen4 x16 for L4, which has no
NVLink; NVLink for the SXM parts). Datasheets give peaks; the cost model
multiplies them by efficiency factors (cost_model.py) that are fitted, once,
to a measured run on L4 and carried over to the other parts unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from .workload import WorkloadError


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_bf16_flops: float      # FLOP/s, dense
    mem_bandwidth: float        # bytes/s
    memory_bytes: float
    link_bandwidth: float       # bytes/s between neighbouring stages
    source: str


GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("L4", 121e12, 300e9, 24e9, 20e9,
            "NVIDIA L4 datasheet: 242 TFLOP/s bf16 with sparsity (121 dense), 300 GB/s GDDR6, "
            "24 GB, PCIe Gen4 x16 (~20 GB/s achieved per direction, no NVLink)"),
    GpuSpec("A100", 312e12, 2039e9, 80e9, 200e9,
            "NVIDIA A100 80GB SXM datasheet: 312 TFLOP/s bf16 dense, 2,039 GB/s HBM2e, "
            "NVLink 600 GB/s (both directions; ~200 GB/s taken for one transfer)"),
    GpuSpec("H100", 989e12, 3350e9, 80e9, 300e9,
            "NVIDIA H100 SXM datasheet: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3, "
            "NVLink 900 GB/s (both directions; ~300 GB/s taken for one transfer)"),
    GpuSpec("H200", 989e12, 4800e9, 141e9, 300e9,
            "NVIDIA H200 SXM datasheet: 989 TFLOP/s bf16 dense, 4.8 TB/s HBM3e, 141 GB, "
            "NVLink 900 GB/s (both directions; ~300 GB/s taken for one transfer)"),
)}


def get_gpu(name: str) -> GpuSpec:
    for key, spec in GPUS.items():
        if key.lower() == name.lower():
            return spec
    raise WorkloadError(f"unknown --gpu {name!r}; known: {', '.join(GPUS)}")
