"""braid.onnx: load an ONNX file as a trainable module, run it, fine-tune it, export a model
(braid/onnx/*.h).

    m = braid.onnx.load("model.onnx")            # an nn.Module (trainable; in eval mode)
    y = m(x)                                     # or m.run([x1, x2]) for several inputs
    m = braid.onnx.load("model.onnx", frozen=True)  # inference: runs with its fused kernels
                                                    # (or any model under `with braid.no_grad():`)
    braid.onnx.export(model, example, "out.onnx", opset=17)
"""

from ._swig import io as _io

OnnxModule = _io.OnnxModule
OnnxOptions = _io.OnnxOptions
ExportOptions = _io.ExportOptions
load_model = _io.load_model
load_tensor = _io.load_tensor
save_tensor = _io.save_tensor


def load(path, frozen=False, constants_as_weights=True):
    """An ONNX file as a module whose initialisers are parameters (frozen: not trainable)."""
    opts = _io.OnnxOptions()
    opts.frozen, opts.constants_as_weights = frozen, constants_as_weights
    return _io.OnnxModule.load(path, opts)


def export(model, example, path, opset=17, input_name="input", output_name="output", dynamic_batch=True):
    """Writes model as ONNX, tracing its layers on example (the batch axis stays symbolic)."""
    opts = _io.ExportOptions()
    opts.opset, opts.input_name, opts.output_name, opts.dynamic_batch = opset, input_name, output_name, dynamic_batch
    _io.export_onnx(model, example, path, opts)


_run = _io.OnnxModule.run
OnnxModule.run = lambda self, inputs: list(_run(self, list(inputs)))
