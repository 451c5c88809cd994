"""ggtools: GGUF tooling for DFlash drafters and surgical requantization of large models."""

__version__ = "0.1.0"
