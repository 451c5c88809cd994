from ggtools.errors import GGToolsError


class QuantError(GGToolsError, ValueError):
    """Bad input to the quants layer: unknown type, row length the block size does not divide,
    data whose size does not match, a type without a kernel."""
