"""Fidelity corrections to the engine profiles, each checked against the engine's code."""

import pytest

from patterns.dtypes import canonical_dtype
from patterns.errors import ConfigError


@pytest.mark.parametrize("name", ["fp8", "mxfp4", "FP8"])
def test_quantised_dtype_refused_with_reason(name):
    # A quantised weight format is not an activation dtype: refused, and the message says
    # the activations stay bf16 and what to give instead.
    with pytest.raises(ConfigError) as err:
        canonical_dtype(name)
    text = str(err.value)
    assert "is not a model dtype; use one of bf16, fp16, fp32" in text
    assert "activations stay bf16" in text and "not --dtype" in text


def test_unknown_dtype_has_no_quantisation_hint():
    with pytest.raises(ConfigError) as err:
        canonical_dtype("complex64")
    assert "activations stay bf16" not in str(err.value)
