"""flightcheck.runtime: a pipeline-parallel PyTorch runtime driven by the
reference scheduler (the only layer that imports torch). See README.md."""

from .config import ConfigError, ModelConfig, PRESETS, from_hf_config, to_hf_config
from .generate import GenerationRequest, RequestResult, RunFailed, RunResult, generate
from .local_executor import LocalExecutor
from .model import Transformer
from .pipeline import PipelineError, PipelineExecutor
from .stage_main import StageSpec
from .stages import Stage, build_model, build_stage, partition_layers, split_into_stages
from .trace import RuntimeTraceWriter, chrome_trace, pipeline_stats
from .weights import WeightSource, load_hf_weights, save_hf_checkpoint

__all__ = [
    "ConfigError", "GenerationRequest", "LocalExecutor", "ModelConfig", "PRESETS",
    "PipelineError", "PipelineExecutor", "RequestResult", "RunFailed", "RunResult",
    "RuntimeTraceWriter", "Stage", "StageSpec", "Transformer", "WeightSource", "build_model",
    "build_stage", "chrome_trace", "from_hf_config", "generate", "load_hf_weights",
    "partition_layers", "pipeline_stats", "save_hf_checkpoint", "split_into_stages",
    "to_hf_config",
]
