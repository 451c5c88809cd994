"""The target model: an architecture table entry (archs.py) picks the pieces each layer uses, a mixer
(mixers/: attention) and an FFN (ffn/: dense, routed experts)."""
