"""FixedArgs: a one-call kernel's fixed arguments (its matmul plans, norms and tables: nested tuples of arrays) as
one numba object that a call passes by reference.

Calling a numba kernel unboxes every array it is given, nested tuples included: ~40 ns an array, 1.6-3.4 us a call
for a one-call piece's plans (a qwen35moe layer's FFN: 3.4 us). A StructRef unboxes as one pointer (0.14 us), its
fields read inside the kernel as the tuple it was made from.
"""

from numba import njit, types
from numba.extending import overload
from numba.experimental import structref

from ggtools.runtime.kernels.ggmlmath import EXACT


@structref.register
class FixedArgsType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class FixedArgs(structref.StructRefProxy):
    """.args: the tuple it holds (inside numba)."""


structref.define_proxy(FixedArgs, FixedArgsType, ["args"])


@njit(**EXACT)
def fixed_args(args):
    """args (a tuple) as a FixedArgs."""
    return FixedArgs(args)


def unpacked(args):
    """Inside numba: the tuple of a FixedArgs, or args itself where it is a tuple (a kernel that other kernels also
    call with the tuple)."""
    raise NotImplementedError("unpacked runs inside numba only")


@overload(unpacked, jit_options=EXACT)
def _unpacked(args):
    if isinstance(args, FixedArgsType):
        return lambda args: args.args
    return lambda args: args
