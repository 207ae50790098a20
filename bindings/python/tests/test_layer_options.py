"""Note [Layer options]: Python's keywords for a layer are the field names of its C++ options struct
(read here from the headers), so nn.Conv2d(1, 16, 3, padding=1, bias=False) and C++'s
Conv2d(1, 16, 3, {.padding = 1, .bias = false}) name the same settings."""
import re
from pathlib import Path

import pytest

from braid import nn

HEADERS = Path(__file__).resolve().parents[3] / "include" / "braid" / "nn"
# options struct -> the layers that take it, with their required arguments
LAYERS = {
    "Conv1dOptions": [("Conv1d", (4, 6, 3))],
    "Conv2dOptions": [("Conv2d", (4, 6, 3))],
    "ConvTranspose2dOptions": [("ConvTranspose2d", (4, 6, 3))],
    "MaxPool2dOptions": [("MaxPool2d", (3,))],
    "AvgPool2dOptions": [("AvgPool2d", (3,))],
    "BatchNormOptions": [("BatchNorm1d", (8,)), ("BatchNorm2d", (8,))],
    "MultiheadAttentionOptions": [("MultiheadAttention", (8, 2))],
    "TransformerEncoderLayerOptions": [("TransformerEncoderLayer", (8, 2))],
    "RNNOptions": [("LSTM", (5, 7)), ("GRU", (5, 7))],
}
LITERALS = {"true": True, "false": False, "nullptr": None, "std::nullopt": None}


def options_structs():
    text = "".join(p.read_text() for p in sorted(HEADERS.glob("*.h")))
    structs = {}
    for name, body in re.findall(r"struct (\w+Options) \{\n(.*?)\n\};", text, re.S):
        fields = re.findall(r"^\s+[\w:<>*\s]+?\b(\w+) = ([^;]+);", body, re.M)
        structs[name] = fields
    return structs


def python_value(literal):
    literal = literal.strip()
    if literal in LITERALS:
        return LITERALS[literal]
    if literal.startswith('"'):
        return literal.strip('"')
    if literal == "{}":
        return None  # "as kernel_size": no value to pass
    return float(literal) if any(c in literal for c in ".e") else int(literal)


def test_every_options_struct_is_checked():
    assert set(options_structs()) == set(LAYERS), "a new options struct needs its layers in LAYERS"


@pytest.mark.parametrize("struct", sorted(LAYERS))
def test_python_keywords_are_the_options_fields(struct):
    fields = options_structs()[struct]
    assert len(fields) > 2, f"{struct}: Note [Layer options] is for layers with more than two settings"
    for layer, required in LAYERS[struct]:
        cls = getattr(nn, layer)
        for field, default in fields:
            value = python_value(default)
            if value is None and default.strip() == "{}":
                continue
            try:
                module = cls(*required, **{field: value})
            except TypeError as e:
                pytest.fail(f"nn.{layer} does not take the keyword {field}= of {struct}: {e}")
            assert module is not None
        with pytest.raises(TypeError):
            cls(*required, no_such_setting=1)
