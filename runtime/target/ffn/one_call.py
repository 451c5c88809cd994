"""OneCallFFN: what the numba FFN pieces with a one-token path share (dense, routed experts, routed plus shared
experts): `one_token` is (the call's fixed arguments, the (n_tasks, work) of each of its matmuls), or None where the
path does not apply, set at load."""

from ggtools.runtime.kernels import workers


class OneCallFFN:
    def in_one_call(self, x) -> bool:
        """Whether x (one token) runs as the piece's one numba call: the path applies, and workers.run_job would run
        every matmul of it in this thread."""
        return len(x) == 1 and self.one_token is not None and workers.matmuls_in_caller(self.one_token[1])
