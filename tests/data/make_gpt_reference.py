#!/usr/bin/python3
"""Reference logits, loss and gradients of the model zoo's GPT (model_zoo/gpt.h), computed by PyTorch
(1.13, CPU, float64) for tests/test_zoo.cpp. Run with Debian's /usr/bin/python3:

    /usr/bin/python3 tests/data/make_gpt_reference.py tests/data

It writes gpt_reference.txt in the format tests/reference_file.h reads (make_layer_reference.py's):

    case gpt/NAME
    param config VOCAB CONTEXT LAYERS HEADS EMBED
    tensor state.NAME float64 SHAPE V...   every parameter, under braid's names
    tensor input.ids int64 N,L ...         token ids
    tensor input.targets int64 N,L ...     next-token targets
    tensor output.logits float64 N,L,V ...
    tensor output.loss float64 scalar ...  mean cross-entropy over the N L positions
    tensor grad.NAME float64 SHAPE ...     d loss / d parameter, under braid's names
    end

The model is written here from PyTorch's own layers, independently of braid's: nn.Embedding for
the token and position tables, pre-norm blocks of nn.LayerNorm, nn.MultiheadAttention (batch
first; its packed in_proj_weight is braid's query, key and value weights stacked, its out_proj
braid's proj) with a boolean causal mask, and nn.GELU(approximate='tanh') between the two Linear
layers of the MLP; then nn.LayerNorm and a bias-free nn.Linear head. Every parameter, the norms'
included, is drawn from N(0, 0.3^2) (norm weights around 1).
"""
import os
import sys

import torch
from torch import nn

SEED = 20261128
gen = torch.Generator().manual_seed(SEED)
F64 = torch.float64


def fmt_tensor(role, name, t):
    t = t.detach()
    kind = {torch.float64: "float64", torch.int64: "int64"}[t.dtype]
    shape = "scalar" if t.dim() == 0 else ",".join(str(d) for d in t.shape)
    flat = t.reshape(-1).tolist()
    vals = " ".join(("%.17g" % v) if kind == "float64" else str(int(v)) for v in flat)
    return f"tensor {role}.{name} {kind} {shape} {vals}"


class Block(nn.Module):
    def __init__(self, E, H):
        super().__init__()
        self.ln_1 = nn.LayerNorm(E)
        self.attn = nn.MultiheadAttention(E, H, batch_first=True)
        self.ln_2 = nn.LayerNorm(E)
        self.mlp = nn.Sequential(nn.Linear(E, 4 * E), nn.GELU(approximate="tanh"), nn.Linear(4 * E, E))

    def forward(self, x):
        L = x.shape[1]
        causal = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)  # True: not allowed
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, V, T, layers, H, E):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, E), nn.Embedding(T, E)
        self.blocks = nn.ModuleList([Block(E, H) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(E)
        self.lm_head = nn.Linear(E, V, bias=False)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def braid_names(model, layers, E):
    """braid's parameter name -> a function of the torch model giving that tensor (or its gradient)."""
    names = {"embed.wte.weight": lambda m: m.wte.weight, "embed.wpe.weight": lambda m: m.wpe.weight,
             "ln_f.weight": lambda m: m.ln_f.weight, "ln_f.bias": lambda m: m.ln_f.bias,
             "lm_head.weight": lambda m: m.lm_head.weight}
    for i in range(layers):
        b = lambda m, i=i: m.blocks[i]
        for n in ("ln_1", "ln_2"):
            for p in ("weight", "bias"):
                names[f"h{i}.{n}.{p}"] = lambda m, b=b, n=n, p=p: getattr(getattr(b(m), n), p)
        for k, part in enumerate(("query", "key", "value")):
            names[f"h{i}.attn.{part}.weight"] = lambda m, b=b, k=k: b(m).attn.in_proj_weight[k * E:(k + 1) * E]
            names[f"h{i}.attn.{part}.bias"] = lambda m, b=b, k=k: b(m).attn.in_proj_bias[k * E:(k + 1) * E]
        names[f"h{i}.attn.proj.weight"] = lambda m, b=b: b(m).attn.out_proj.weight
        names[f"h{i}.attn.proj.bias"] = lambda m, b=b: b(m).attn.out_proj.bias
        for j in (0, 2):
            names[f"h{i}.mlp.{j}.weight"] = lambda m, b=b, j=j: b(m).mlp[j].weight
            names[f"h{i}.mlp.{j}.bias"] = lambda m, b=b, j=j: b(m).mlp[j].bias
    return names


def case(name, V, T, layers, H, E, N, L):
    model = Gpt(V, T, layers, H, E).double()
    with torch.no_grad():
        for n, p in model.named_parameters():
            base = 1.0 if ("ln" in n and n.endswith("weight")) else 0.0
            p.copy_(base + 0.3 * torch.randn(p.shape, dtype=F64, generator=gen))
    ids = torch.randint(0, V, (N, L), generator=gen)
    targets = torch.randint(0, V, (N, L), generator=gen)
    logits = model(ids)
    loss = nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()
    names = braid_names(model, layers, E)
    assert len(names) == len(list(model.parameters())) + 4 * layers, "every parameter is named"
    lines = [f"case gpt/{name}", f"param config {V} {T} {layers} {H} {E}"]
    lines += [fmt_tensor("state", n, f(model)) for n, f in names.items()]
    lines += [fmt_tensor("input", "ids", ids), fmt_tensor("input", "targets", targets)]
    lines += [fmt_tensor("output", "logits", logits), fmt_tensor("output", "loss", loss)]
    grads = braid_names(Grads(model), layers, E)
    lines += [fmt_tensor("grad", n, f(Grads(model))) for n, f in grads.items()]
    return lines + ["end"]


class Grads:
    """The model's attributes with every parameter replaced by its gradient (for braid_names)."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, n):
        v = getattr(self._obj, n)
        if isinstance(v, torch.nn.Parameter):
            return v.grad
        return Grads(v)

    def __getitem__(self, i):
        return Grads(self._obj[i])


def main(out_dir):
    lines = case("small", V=11, T=8, layers=2, H=2, E=8, N=2, L=6)
    lines += case("four_heads_full_context", V=16, T=5, layers=1, H=4, E=16, N=3, L=5)
    with open(os.path.join(out_dir, "gpt_reference.txt"), "w") as f:
        f.write(f"# generated by tests/data/make_gpt_reference.py (seed {SEED}, torch {torch.__version__}); "
                "do not edit\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
