#!/usr/bin/env python3
"""Runs an ONNX model in onnxruntime for braid's export tests.

usage: onnx_ort_run.py MODEL OUT_PREFIX INPUT.pb [INPUT.pb ...]

Reads each input as an ONNX TensorProto, runs the model with onnxruntime's CPU provider (one
thread, so results do not depend on the machine), and writes output i to OUT_PREFIX<i>.pb. Exits
with 77 (the test suite's "skipped") when onnx or onnxruntime cannot be imported.
"""
import sys

try:
    import numpy as np  # noqa: F401
    import onnx
    from onnx import numpy_helper
    import onnxruntime as ort
except ImportError as e:  # the caller skips the comparison with this message
    print(f"onnxruntime is not available: {e}", file=sys.stderr)
    sys.exit(77)


def main():
    model, prefix, inputs = sys.argv[1], sys.argv[2], sys.argv[3:]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    feeds = {}
    for meta, path in zip(sess.get_inputs(), inputs):
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        feeds[meta.name] = numpy_helper.to_array(t)
    outs = sess.run(None, feeds)
    for i, o in enumerate(outs):
        with open(f"{prefix}{i}.pb", "wb") as f:
            f.write(numpy_helper.from_array(o).SerializeToString())


if __name__ == "__main__":
    main()
