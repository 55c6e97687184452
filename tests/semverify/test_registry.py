"""Method and rule parameters are checked by the type of their defaults, with the parameter named."""

import pytest

from semverify import get_rule
from semverify.methods import parse_method


@pytest.mark.parametrize("spec, message", [
    ("typical:posterior_threshold=abc", "posterior_threshold expects a number, got 'abc'"),
    ("sense:top_k=2.5", "top_k expects an integer, got 2.5"),
    ("easd:normalize=1", "normalize expects true or false, got 1"),
])
def test_a_parameter_of_the_wrong_type_is_named(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_method(spec)


def test_parameters_of_the_right_type_pass():
    method = parse_method("typical:posterior_threshold=1,posterior_alpha=inf")
    assert method.rule_params["posterior_alpha"] == float("inf")
    assert get_rule("sense", theta_e=1).theta_e == 1.0  # an integer where a number is expected
    assert get_rule("fly", window=0).window == 0
