"""Pictures of runs: a pipeline timeline (PNG, Perfetto JSON) from any trace
with stage events, and TTFT/TPOT CDFs comparing runs. matplotlib is needed
for PNGs only and imported when a PNG is drawn."""
