"""flightcheck: a formally checked model of in-flight batch accounting for
pipeline-parallel LLM serving (spec, verification, reference scheduler,
runtime)."""

__version__ = "0.1.0"
