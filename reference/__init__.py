"""A vLLM-V1-style scheduler, KV block manager and engine batch queue that
obeys flightcheck's spec (no torch; standard library only). See README.md."""

from .config import SchedulerConfig
from .engine import Engine, Executor, Future
from .kv_cache_manager import KVCacheManager
from .outputs import (CachedRequestData, EngineCoreOutput, ModelRunnerOutput, NewRequestData,
                      SchedulerOutput)
from .request import Request, RequestStatus, SamplingParams
from .scheduler import Fate, Scheduler
from .scripted_executor import Sample, ScriptedExecutor
from .trace import TraceWriter, TracingScheduler, make_scheduler

__all__ = [
    "CachedRequestData", "Engine", "EngineCoreOutput", "Executor", "Fate", "Future",
    "KVCacheManager", "ModelRunnerOutput", "NewRequestData", "Request",
    "RequestStatus", "Sample", "SamplingParams", "Scheduler", "SchedulerConfig",
    "SchedulerOutput", "ScriptedExecutor", "TraceWriter", "TracingScheduler", "make_scheduler",
]
