"""Reference engine over Hugging Face models; the decoding loop is `generator.SpeculativeGenerator._speculate`."""

from .generator import METHODS, GenerationResult, SpeculativeGenerator
from .target import TargetModel, TargetOutput

__all__ = ["METHODS", "GenerationResult", "SpeculativeGenerator", "TargetModel", "TargetOutput"]
