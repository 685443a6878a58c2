"""transformers-longspec: lossless long-context speculative decoding (LongSpec) for HuggingFace transformers.

    import transformers_longspec                      # registers the generate hook, attention and Auto classes
    draft = LongSpecDraft.from_pretrained(path, target_model=target)
    out = target.generate(ids, assistant_model=draft, max_new_tokens=256)   # same tokens as without the draft

Reference: LongSpec (Yang, Du et al., arXiv 2502.17421).
"""

from . import compat
from .cache import LongSpecCache
from .configuration import LongSpecConfig
from .generation import LongSpecCandidateGenerator, LongSpecStats, longspec_tree_decode
from .modeling import LongSpecDraft

compat.install(longspec_tree_decode)

__version__ = "0.1.0"

__all__ = [
    "LongSpecCache",
    "LongSpecCandidateGenerator",
    "LongSpecConfig",
    "LongSpecDraft",
    "LongSpecStats",
    "longspec_tree_decode",
]
