"""The spec: request lifecycle and in-flight batch accounting of vLLM V1's
scheduler under pipeline parallelism, as a state machine in plain Python.

Standard library only. Read `README.md` beside this file for the prose.
"""

from .actions import Prompt, Sample, abort, arrive, complete_oldest, sampling_entries
from .config import Config, KvConnector
from .kv_reports import fail_kv_load, fail_kv_output, receive_kv, send_kv
from .invariants import COUNTER_INVARIANTS, INVARIANTS, Invariant, invariants_for, violated
from .profiles import DEFAULT_PROFILE, PROFILES, Profile
from .schedule import Scheduled, ScheduledEntry, schedule
from .sometimes import SOMETIMES, Sometimes
from .state import BlockPool, Entry, Fate, Load, Pause, Request, State, Status, describe, initial_state
from .transitions import (TRANSITION_PROPERTIES, Abort, Action, Arrive, ArriveAs, CompleteOldest,
                          FailKvLoad, FailKvOutput, ReceiveKv, Reset, Schedule, SendInput, SendKv, SetPause,
                          step,
                          transition_properties_for)

__all__ = [
    "Abort", "Action", "Arrive", "ArriveAs", "BlockPool", "CompleteOldest", "Config", "DEFAULT_PROFILE", "Entry", "Fate",
    "FailKvLoad", "FailKvOutput", "KvConnector", "Load", "Pause", "Reset", "SetPause", "ReceiveKv", "SendInput",
    "SendKv", "fail_kv_load", "fail_kv_output", "receive_kv", "send_kv",
    "INVARIANTS", "Invariant", "PROFILES", "Profile", "Prompt", "Request", "Sample", "SOMETIMES",
    "Schedule", "Scheduled", "ScheduledEntry", "Sometimes", "State", "Status",
    "TRANSITION_PROPERTIES", "COUNTER_INVARIANTS", "invariants_for", "transition_properties_for", "abort", "arrive", "complete_oldest", "describe",
    "initial_state", "sampling_entries", "schedule", "step", "violated",
]
