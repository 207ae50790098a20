"""The style guide's rule 13, "one op, few files": a newcomer reads an op's forward, backward and every
backend's kernels in at most three files (src/ops/<op>.cpp, src/backend/cpu/<op>.cpp and
src/backend/cuda/<op>.cu). For each op in OPS this finds the files under src/, layers/ and
distributed/ that define one of its symbols and fails, listing them, when there are more than three.

Run as a script with a source tree's path (python3 tests/tools/test_op_files.py /path/to/braid) to
print the map of another tree; under pytest BRAID_OP_FILES_ROOT names the tree (default: this one).
"""
import os
import re
import sys
from pathlib import Path

import pytest

MAX_FILES = 3
FOLDERS = ("src", "layers", "distributed")
EXTENSIONS = {".cpp", ".h", ".hpp", ".cu", ".cuh"}

# Per op, the symbols whose definitions make up its forward, backward and kernels: the public
# function and the helpers that record its backward (src/ops, src/optim), the Backend primitives it
# calls (a definition qualified by CpuBackend::, CudaBackend::, or unqualified in a backend's class
# body), and the kernels and launchers behind them on the CPU and on CUDA. A name with "::" matches
# only so qualified. Definitions qualified by Backend:: or FusedKernels:: are not counted: those are
# the interface's defaults of the fused kernels ("no kernel", src/backend/registry.cpp), part of
# the interface as backend.h is. Declarations (a signature ending in ";") never count, so headers
# that only declare (backend.h, cpu_backend.h, cuda_backend.h, kernels.h, include/braid) drop out.
# The first symbol of each op must be found: a renamed front door fails here rather than passing
# with nothing to count.
OPS = {
    "conv2d": [
        "conv2d", "conv2d_with", "conv_nd", "conv_recorded", "conv_forward", "conv_adjoint", "conv_weight_grad",
        # Backend primitives
        "im2col", "col2im", "depthwise_conv2d", "conv2d_backward_input", "conv2d_backward_weight",
        "conv2d_prefers_channels_last", "pointwise_conv2d",
        # kernels and launchers
        "im2col_kernel", "col2im_kernel", "depthwise_kernel", "depthwise_plane", "launch_im2col", "launch_col2im",
        "launch_depthwise_conv2d",
    ],
    "max_pool2d": [
        "max_pool2d", "pool_window",
        "max_pool2d_channels_last",
        "max_pool_kernel", "max_pool_2x2_kernel", "max_pool_2x2_plane", "max_pool_nhwc_kernel", "max_pool_nhwc_row",
        "launch_max_pool2d",
    ],
    "layer_norm": [
        "layer_norm", "layer_norm_with_stats",
        "layer_norm_rows",
        "layer_norm_row", "layer_norm_kernel", "launch_layer_norm",
    ],
    "scaled_dot_product_attention": [
        "scaled_dot_product_attention", "composite_grads",
        "attention_forward", "attention_backward",
        "attention_fwd_block_kernel", "attention_dq_block_kernel", "attention_dkv_block_kernel",
        "attention_delta_kernel",
    ],
    "softmax": [
        "softmax",
        "softmax_rows",
        "softmax_row", "softmax_kernel", "launch_softmax",
    ],
    "Adam": [
        "Adam::update", "Adam::Adam", "AdamW::AdamW", "Adam::check_options", "adam_defaults",
        "adam_step",
        "adam_kernel", "adam_step_kernel", "launch_adam_step",
    ],
}
# A backend's kernels that a vendor library runs live beside the backend's own and count as one
# file with them: src/backend/cuda/cudnn_conv.cpp (cuDNN's convolutions, Note [cuDNN convolutions])
# is the CUDA part of conv2d with conv.cu, whose kernels are the composite's primitives.
COMPANIONS = {"src/backend/cuda/cudnn_conv.cpp": "src/backend/cuda/conv.cu"}
# The shadow device (a test device) computes nothing of its own: it forwards every primitive to the
# CPU's kernels and copies the CUDA backend's rules (Note [The shadow device's capability set]), a
# choice it may make per primitive by hand, as for conv2d_prefers_channels_last in training. Its
# definitions are not an op's arithmetic, so they are not counted.
NOT_COUNTED = {"src/backend/shadow/shadow_backend.cpp"}
# The backend of a definition's qualifier that is the interface's own (see above).
INTERFACE_QUALIFIERS = {"Backend", "FusedKernels"}
TRAILING = re.compile(r"\s*(?:(?:const|override|final|noexcept|mutable)\b\s*)*")


def strip_comments(text):
    """text with // and /* */ comments blanked out (string literals kept), line breaks kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def closing_paren(text, i):
    """The index after the parenthesis that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def defines(text, symbol):
    """Whether text (comments stripped) holds a definition of symbol: its name, then a parameter
    list, then (after const/override/...) a body's "{" or a constructor's initialiser list; a call
    ends in ";", ")", "," or an operator instead."""
    if "::" in symbol:
        pattern = re.compile(r"(?<![\w:])(?:\w+::)*" + re.escape(symbol) + r"\s*\(")
    else:
        pattern = re.compile(r"(?<![\w:])(?:(?:\w+::)*(\w+)::)?" + re.escape(symbol) + r"\s*\(")
    for m in pattern.finditer(text):
        if "::" not in symbol and m.group(1) in INTERFACE_QUALIFIERS:
            continue
        before = text[:m.start()].rstrip()
        if before.endswith((".", "->")):  # a call on an object
            continue
        end = closing_paren(text, m.end() - 1)
        rest = text[end:end + 400]
        rest = rest[TRAILING.match(rest).end():]
        if rest.startswith("{"):
            return True
        # A constructor's initialiser list (only a qualified name: after a call, ":" is a ternary's).
        if "::" in symbol and rest.startswith(":") and not rest.startswith("::"):
            return True
    return False


def source_files(root):
    for folder in FOLDERS:
        base = root / folder
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if p.suffix in EXTENSIONS and p.is_file():
                yield p


def op_map(root):
    """{op: {file: [symbols it defines]}} over the tree at root."""
    texts = {p.relative_to(root).as_posix(): strip_comments(p.read_text(errors="replace")) for p in source_files(root)}
    result = {}
    for op, symbols in OPS.items():
        files = {}
        for name, text in texts.items():
            if name in NOT_COUNTED:
                continue
            found = [s for s in symbols if s.split("::")[-1] in text and defines(text, s)]
            if found:
                files.setdefault(COMPANIONS.get(name, name), []).extend(found)
        result[op] = files
    return result


def tree():
    return Path(os.environ.get("BRAID_OP_FILES_ROOT", Path(__file__).resolve().parents[2]))


@pytest.fixture(scope="module")
def mapping():
    return op_map(tree())


@pytest.mark.parametrize("snippet, symbol, expected", [
    ("Tensor softmax(const Tensor& x, int64_t axis) {\n  return x;\n}", "softmax", True),
    ("bool CpuBackend::softmax_rows(const Tensor& x,\n    const Tensor& out) {", "softmax_rows", True),
    ("  bool softmax_rows(const Tensor& x, const Tensor& out) override {", "softmax_rows", True),
    ("__global__ void __launch_bounds__(kThreads)\n    softmax_kernel(const T* x) {", "softmax_kernel", True),
    ("Adam::Adam(std::vector<ParamGroup> g) : Adam(\"Adam\", false) {}", "Adam::Adam", True),
    ("bool braid::detail::CpuBackend::adam_step(const Tensor& p) {", "adam_step", True),
    ("Tensor softmax(const Tensor& x, int64_t axis);", "softmax", False),  # a declaration
    ("bool Backend::softmax_rows(const Tensor&, const Tensor&) { return false; }", "softmax_rows", False),
    ("bool FusedKernels::softmax_rows(const Tensor&, const Tensor&) { return false; }", "softmax_rows", False),
    ("  y = softmax(x, -1);\n  if (backend.softmax_rows(x, y)) {", "softmax_rows", False),  # calls
    ("  if (softmax(x, 1).defined()) {", "softmax", False),
    ("  return ok ? softmax(x, 1) : softmax(x, 0);", "softmax", False),
    ("  X(softmax_rows, (const Tensor& x, const Tensor& out), (x, out))", "softmax_rows", False),
    (strip_comments("// Tensor softmax(const Tensor& x) { in a comment\n"), "softmax", False),
])
def test_definitions_are_told_from_declarations_and_calls(snippet, symbol, expected):
    assert defines(snippet, symbol) == expected


@pytest.mark.parametrize("op", sorted(OPS))
def test_op_front_door_is_found(mapping, op):
    front = OPS[op][0]
    assert any(front in found for found in mapping[op].values()), (
        f"{op}: no definition of {front} under {', '.join(FOLDERS)} of {tree()}: rename it in OPS")


@pytest.mark.parametrize("op", sorted(OPS))
def test_op_is_read_in_few_files(mapping, op):
    files = mapping[op]
    assert len(files) <= MAX_FILES, (
        f"{op} is defined across {len(files)} files (at most {MAX_FILES}: src/ops/<op>.cpp, "
        f"src/backend/cpu/<op>.cpp, src/backend/cuda/<op>.cu; ../shared/STYLE.md rule 13):\n"
        + "\n".join(f"  {name}: {', '.join(found)}" for name, found in sorted(files.items())))


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else tree()
    worst = 0
    for op, files in op_map(root).items():
        worst = max(worst, len(files))
        print(f"{op}: {len(files)} files")
        for name, found in sorted(files.items()):
            print(f"  {name}: {', '.join(found)}")
    sys.exit(0 if worst <= MAX_FILES else 1)
