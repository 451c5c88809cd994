"""M-RoPE on text tokens (qwen35's IMROPE, the MROPE of drafters for such targets): which rotated pairs take the
fourth position id (0 for text), against a transcription of ggml_mrope_cache_init's section choice."""

import numpy as np
import pytest

from ggtools.runtime.kernels import ops


def ggml_sources(n_pairs, sections, imrope):
    """Per rotated pair, the position id ggml_mrope_cache_init (ggml-cpu/ops.cpp) uses: 't', 'h', 'w' or 'e'."""
    s0, s1, s2, s3 = sections
    sect_dims, sec_w = s0 + s1 + s2 + s3, s0 + s1
    out = []
    for i in range(n_pairs):
        sector = i % sect_dims
        if imrope:
            if sector % 3 == 1 and sector < 3 * s1:
                out.append("h")
            elif sector % 3 == 2 and sector < 3 * s2:
                out.append("w")
            elif sector % 3 == 0 and sector < 3 * s0:
                out.append("t")
            else:
                out.append("e")
        elif s0 <= sector < sec_w:
            out.append("h")
        elif sec_w <= sector < sec_w + s2:
            out.append("w")
        elif sector >= sec_w + s2:
            out.append("e")
        else:
            out.append("t")
    return out


@pytest.mark.parametrize("n_pairs, sections", [(32, (11, 11, 10, 0)), (8, (3, 3, 2, 0)), (8, (2, 2, 2, 2)),
                                               (16, (3, 1, 2, 2)), (32, (32, 0, 0, 0)), (12, (2, 2, 1, 1))])
@pytest.mark.parametrize("imrope", [True, False])
def test_fourth_section_pairs_follow_ggml(n_pairs, sections, imrope):
    want = np.array([s == "e" for s in ggml_sources(n_pairs, sections, imrope)])
    assert np.array_equal(ops.fourth_section_pairs(n_pairs, sections, imrope), want)


def test_text_angles_take_position_0_for_the_fourth_section():
    n_dims, sections = 16, (2, 2, 2, 2)
    positions = np.array([0, 3, 17, 250], np.int64)

    def angles(pos):
        return ops.rope_angles(pos, n_dims, 10000.0, np.float32(1.0), np.zeros(0, np.float32), *ops.NO_YARN)

    still = ops.fourth_section_pairs(n_dims // 2, sections, True)
    cos, sin = ops.text_rope_angles(angles(positions), angles(np.zeros(1, np.int64)), still)
    plain_cos, plain_sin = angles(positions)
    assert still.sum() == 2
    assert np.array_equal(cos[:, ~still], plain_cos[:, ~still]) and np.array_equal(sin[:, ~still], plain_sin[:, ~still])
    assert np.all(cos[:, still] == 1.0) and np.all(sin[:, still] == 0.0)
