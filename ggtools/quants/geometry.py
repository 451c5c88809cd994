"""ggml types by name or id, and their block geometry (from gguf-py): no kernels, so checks that only need a
type's block size (rowcheck.py, plans) load no numba."""

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .errors import QuantError

T = GGMLQuantizationType


def parse_qtype(qtype) -> GGMLQuantizationType:
    """A GGMLQuantizationType from a member, an int id or a name ("q4_k", "Q4_K")."""
    try:
        if isinstance(qtype, str):
            return T[qtype.strip().upper()]
        return T(qtype)
    except (KeyError, ValueError):
        raise QuantError(f"unknown tensor type {qtype!r}") from None


def block_size(qtype) -> int:
    """Values per block (1 for F32/F16/BF16)."""
    return GGML_QUANT_SIZES[parse_qtype(qtype)][0]


def type_size(qtype) -> int:
    """Bytes per block."""
    return GGML_QUANT_SIZES[parse_qtype(qtype)][1]
