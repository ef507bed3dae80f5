"""CPU generation backend: a batched transformers generator with verl's ``generate`` call (see docs/cpu_generator.md)."""

from agentevolver.backends.cpu.generator import GenerationError, GeneratorClosedError, HFGenerator
from agentevolver.backends.cpu.sampling import SamplingSettings, parse_sampling_params

__all__ = ["GenerationError", "GeneratorClosedError", "HFGenerator", "SamplingSettings", "parse_sampling_params"]
