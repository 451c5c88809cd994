"""DirectCall: a numba kernel called through its compiled overload's entry point, skipping numba's per-call typing.

numba's dispatcher types every argument on every call to pick the overload: for a one-call path's ~40 arguments
(nested tuples of matmul plans among them) that is ~2 us a call, 16 calls a token on a 4-layer tiny target, about
7% of its step. A one-call path's arguments keep their types from call to call: the piece's fixed plans, tables and
norms, and arrays the runtime makes itself (the residual stream, positions, RoPE tables, cache rows: C-contiguous,
of the model's types). So the first call goes through the dispatcher (which compiles or loads the overload) and the
later ones straight to the overload it ran. One DirectCall per call site of one piece: a site whose argument types
can differ between calls (another dtype, layout or tuple shape) must not use it. With GGTOOLS_CHECK_DIRECT_CALLS=1
(the tests set it) every call checks that its types are the first call's.
"""

from ggtools.environment import setting


class DirectCall:
    def __init__(self, kernel):
        self.kernel = kernel
        self.entry = None
        self.types = None
        self.check_types = setting("GGTOOLS_CHECK_DIRECT_CALLS")

    def __call__(self, *args):
        if self.entry is None:
            return self._first_call(args)
        if self.check_types and self._types_of(args) != self.types:
            raise TypeError(f"{self.kernel.__name__}: argument types {self._types_of(args)} differ from the first "
                            f"call's {self.types}")
        return self.entry(*args)

    def _first_call(self, args):
        result = self.kernel(*args)
        self.types = self._types_of(args)
        overload = self.kernel.overloads.get(self.types)
        # no such overload (numba widened a type when it compiled): the dispatcher serves on
        self.entry = self.kernel if overload is None else overload.entry_point
        return result

    def _types_of(self, args) -> tuple:
        return tuple(self.kernel.typeof_pyval(a) for a in args)
