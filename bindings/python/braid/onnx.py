"""braid.onnx: load an ONNX file as a trainable module, run it, fine-tune it, export a model
(braid/onnx/*.h).

    m = braid.onnx.load("model.onnx")            # an nn.Module (trainable; in eval mode)
    y = m(x)                                     # or m.run([x1, x2]) for several inputs
    m = braid.onnx.load("model.onnx", frozen=True)  # inference: runs with its fused kernels
                                                    # (or any model under `with braid.no_grad():`)
    braid.onnx.export(model, example, "out.onnx", opset=17)
"""

from ._swig.io import (OnnxModule, OnnxOptions, ExportOptions, load_model, load_tensor, save_tensor,  # noqa: F401
                       export_onnx as export)

load = OnnxModule.load
