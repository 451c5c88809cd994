"""OneCallFFN: what the numba FFN pieces with a one-token path share (dense, routed experts, routed plus shared
experts): `one_token` is the call's fixed arguments, or None where the path does not apply, set at load;
`one_token_fixed` the same as the FixedArgs the piece's own call passes (other pieces embed the tuple)."""

class OneCallFFN:
    def in_one_call(self, x) -> bool:
        """Whether x (one token) runs as the piece's one numba call (its matmuls split across the workers where
        worth it: matmul.plan_rows)."""
        return len(x) == 1 and self.one_token is not None
