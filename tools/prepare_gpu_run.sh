#!/usr/bin/env bash
# Prepares `.gpu/` for training with `python -m flax_xalign.train` on a GPU host that has JAX (CUDA), flax,
# optax, orbax, numpy and sentencepiece but no TensorFlow, seqio or gin, and cannot install from an index
# (Python 3.12 there; this checkout's pins are for 3.11, so the package runs from the source tree).
#
#   tools/prepare_gpu_run.sh [ROWS] [VOCABULARY]
#
# Writes, here (where seqio and TensorFlow are installed):
#   .gpu/wheels/  what the host lacks, as CPython 3.12 manylinux wheels: gin-config, grain, array-record, conllu,
#                 portpicker, cloudpickle (about 5 MB)
#   .gpu/cache/   a packed cache (train split) of the Bible mixture, rows of 512 tokens, ROWS rows
#                 (default 6000: ~31 MB with a 250k vocabulary, under the 64 MiB a device call carries).
#                 With VOCABULARY (a SentencePiece model, e.g. XLM-R's: runs/e5_bible/vocabulary.model from
#                 `xalign e5_small`) the Bible tasks are tokenised with it (task
#                 xlmr_bible_grc_en_mlm_tlm), so the model has XLM-R base's 250,002-row embedding.
# Then, on the GPU host, from the repository root with `.gpu` carried, .gpu/run.sh trains XLM-R base (bf16,
# cuDNN attention, layers unrolled: runs/nvidia_gpu.gin; MLM+TLM, then MLM+TLM+DWA) from the cache and prints each run's tokens/s, step time and MFU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROWS="${1:-6000}"
VOCABULARY="${2:-}"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p .gpu
rm -rf .gpu/wheels .gpu/cache
"$PY" -m pip download --quiet --only-binary=:all: --python-version 3.12 --no-deps -d .gpu/wheels \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  gin-config==0.5.0 grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 cloudpickle==3.1.1 conllu==6.0.0
TASK=bible_grc_en_mlm_tlm
GIN=()
if [[ -n "$VOCABULARY" ]]; then
  TASK=xlmr_bible_grc_en_mlm_tlm
  cat > .gpu/tasks.gin <<GIN
train.user_tasks = [@BibleTasks()]
BibleTasks.prefix = 'xlmr_bible'
BibleTasks.vocabulary_path = '$VOCABULARY'
MIXTURE_OR_TASK_NAME = '$TASK'
TASK_FEATURE_LENGTHS = {'tokens': 512}
GIN
  GIN=(--gin_file=.gpu/tasks.gin)
fi
"$PY" -m flax_xalign.cli.cache --task="$TASK" --split=train --output=.gpu/cache --length=512 --examples="$ROWS" \
  "${GIN[@]}"
cat > .gpu/run.sh <<RUN
#!/usr/bin/env bash
# Written by tools/prepare_gpu_run.sh: XLM-R base from the packed cache, bf16, on one GPU.
set -euo pipefail
python3 -m pip install --quiet --no-deps --target=/tmp/gpu_site .gpu/wheels/*.whl
export PYTHONPATH="\$PWD:/tmp/gpu_site" XLA_PYTHON_CLIENT_MEM_FRACTION=.92
BATCH="\${BATCH:-64}" STEPS="\${STEPS:-60}"
for objectives in mlm_tlm xlm_align; do
  extra=()  # XLM-Align warm-starts from a checkpoint in the paper; for throughput, from scratch.
  [[ \$objectives == xlm_align ]] && extra=(--gin.INIT_FROM_CHECKPOINT=None)
  python3 -m flax_xalign.train --gin_file=runs/pretrain.gin --gin_file=models/base.gin \\
    --gin_file=objectives/\$objectives.gin --gin_file=runs/nvidia_gpu.gin \\
    --gin.MIXTURE_OR_TASK_NAME="'$TASK'" --gin.TASK_FEATURE_LENGTHS="{'tokens': 512}" \\
    --gin.train.data="'cache:.gpu/cache'" --gin.MODEL_DIR="'/tmp/gpu_\$objectives'" \\
    --gin.BATCH_SIZE=\$BATCH --gin.TRAIN_STEPS=\$STEPS --gin.LOG_EVERY=10 --gin.CHECKPOINT_EVERY=\$STEPS \\
    --gin.EVAL_EVERY=0 --gin.EncoderConfig.dropout_rate=0.0 "\${extra[@]}" 2>&1 | grep -v "^I0000\|^W0000"
done
RUN
chmod +x .gpu/run.sh
du -sh .gpu/wheels .gpu/cache
echo "carry .gpu to the GPU host and run: bash .gpu/run.sh   (BATCH=128 STEPS=60 bash .gpu/run.sh for another batch)"
