"""Reference engine over Hugging Face models; the decoding loop is `generator.SpeculativeGenerator._speculate`.

Drafting methods are `proposers.Proposer` objects (`ChainProposer` for DFlash, `ReAnchorProposer`);
the round's device steps are the round core's (`sglang_reanchor.round`).
"""

from .generator import METHODS, GenerationResult, SpeculativeGenerator
from .proposers import ChainProposer, Draft, Drafting, Proposer, ReAnchorProposer
from .target import TargetModel, TargetOutput

__all__ = ["METHODS", "ChainProposer", "Draft", "Drafting", "GenerationResult", "Proposer", "ReAnchorProposer",
           "SpeculativeGenerator", "TargetModel", "TargetOutput"]
