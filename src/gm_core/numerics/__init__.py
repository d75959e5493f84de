"""Reference numerics of gm: merge, outer step, alignment, wire formats (numpy, pure).

Theory of operation
-------------------
Every operation works on flat contiguous fp32 buffers, in place, with the tensor
boundaries described by a :class:`Layout`. This package is the reference: the
backends in :mod:`gm_shell.backends` must agree with it exactly for the integer
codecs and bf16 rounding, and within fp32 rounding for merges. See each module's
docstring for the algorithm it holds.
"""

from gm_core.numerics.align import align
from gm_core.numerics.feedback import apply_update, publish_update
from gm_core.numerics.layout import Layout, Span
from gm_core.numerics.merge import Contributions, all_finite, mean_pairwise_cosine, merge
from gm_core.numerics.outer import nesterov, outer_step
from gm_core.numerics.quant import WireLayout, WireTensor, decode, encode, wire_layout
from gm_core.numerics.shuffle import shuffle, unshuffle
from gm_core.numerics.step import merge_step

__all__ = [
    "Contributions",
    "Layout",
    "Span",
    "WireLayout",
    "WireTensor",
    "align",
    "all_finite",
    "apply_update",
    "decode",
    "encode",
    "mean_pairwise_cosine",
    "merge",
    "merge_step",
    "nesterov",
    "outer_step",
    "publish_update",
    "shuffle",
    "unshuffle",
    "wire_layout",
]
