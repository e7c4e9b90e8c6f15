#!/usr/bin/env bash
# tpu_launch.sh: run flax_xalign on every worker of a Cloud TPU VM (a pod slice
# or a single host) by starting the identical command on all of them through
#   gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" [--project P] \
#     --worker=all --command "..."
#
# Usage:
#   tpu_launch.sh [options] setup [--git URL [--ref REF]]
#       Put the code in REPO_DIR on every worker, create REPO_DIR/.venv with
#       python3.11 and `pip install -e '.[tpu]'` (jax[tpu]==0.10.2, libtpu
#       0.0.42.*), then check that all workers see the whole slice.
#       Default: copy this checkout (tracked + untracked, non-ignored files;
#       no .venv) as a tarball with `gcloud ... tpu-vm scp --worker=all`.
#       --git URL: `git clone` URL on each worker (or fetch if present);
#       --ref REF: check out origin's REF (branch, tag or commit), detached;
#       without --ref an existing clone is fast-forwarded. A copy (default
#       mode) unpacks over REPO_DIR: files deleted here stay on the workers.
#   tpu_launch.sh [options] train [--nohup] [--env KEY=VALUE]... -- ARGS...
#       On every worker: cd REPO_DIR; KEY=VALUE... .venv/bin/python -m
#       flax_xalign.train ARGS..., output appended to
#       REPO_DIR/logs/train-<hostname>.log (one log per worker), the pid in
#       REPO_DIR/logs/train-<hostname>.pid. Without --nohup the output also streams here
#       (all workers interleaved) and Ctrl-C ends the local gcloud only: use
#       `kill` to stop the workers. With --nohup it starts detached and returns.
#   tpu_launch.sh [options] kill
#       Stop the run started by `train` on every worker (TERM, then KILL after
#       20 s) using the pid file, and show what still holds /dev/accel*.
#   tpu_launch.sh [options] logs [--worker N|all] [-n LINES] [-f]
#       Tail the per-worker train logs (default worker 0, 50 lines).
#   tpu_launch.sh [options] run -- COMMAND...
#       Run an arbitrary command in REPO_DIR on every worker.
#
# Options (each also read from the environment variable in brackets):
#   --tpu NAME        TPU VM name                                   [TPU_NAME]
#   --zone ZONE       its zone, e.g. us-central2-b                  [ZONE]
#   --project ID      GCP project (default: gcloud's configured one) [PROJECT]
#   --repo-dir DIR    checkout on the workers; a relative path (or one that
#                     starts with '~/', quoted so your local shell keeps it) is
#                     taken from the remote home directory (default: flax_xalign).
#                                                                   [REPO_DIR]
#   --python PY       interpreter for the remote venv (default python3.11)
#                                                                   [PYTHON]
#   --dry-run         print the gcloud commands instead of running them
#   -h, --help        this text
#
# Multi-host: the train entry point calls jax.distributed.initialize() when it
# runs on more than one host; on Cloud TPU that needs no arguments (the
# coordinator and process ids come from the TPU metadata), which is why the
# very same command is started on every worker, at the same time. Each
# worker's process feeds its own share of the global batch; all hosts must run
# the same code and flags, so re-run `setup` after changing the code. MODEL_DIR
# must be storage every worker sees (gs://...; docs/buckets.md: only process 0 writes the run's files, the
# lock is an object with a lease, a missing bucket is refused before training). `kill` sends SIGTERM, which jax's
# preemption service passes to every worker so all save at one step. To run the
# same multi-process code path on one machine (CPU), see docs/MULTIHOST.md.
#
# Example:
#   export TPU_NAME=xalign-v4-32 ZONE=us-central2-b PROJECT=my-proj
#   ./tpu_launch.sh setup
#   ./tpu_launch.sh train --nohup --env TF_CPP_MIN_LOG_LEVEL=2 -- \
#     --gin_file=gin_configs/runs/pretrain.gin \
#     --gin.MODEL_DIR="'gs://my-bucket/xalign/run1'"
#   ./tpu_launch.sh logs -f
#   ./tpu_launch.sh kill
set -euo pipefail

TPU_NAME="${TPU_NAME:-}"
ZONE="${ZONE:-}"
PROJECT="${PROJECT:-}"
REPO_DIR="${REPO_DIR:-flax_xalign}"
PYTHON="${PYTHON:-python3.11}"
DRY_RUN=0

die() {
  printf 'tpu_launch.sh: %s\n' "$*" >&2
  exit 2
}

usage() {
  sed -n '2,/^set -euo pipefail$/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

# Quote each argument for a POSIX/bash shell and join with spaces.
quote_args() {
  local out="" arg
  for arg in "$@"; do
    out+="${out:+ }$(printf '%q' "$arg")"
  done
  printf '%s' "$out"
}

# The remote side: a one-line bash script, run as `bash -c <script>` so that
# it does not depend on the login shell of the TPU VM user.
remote_bash() {
  printf 'bash -c %q' "$1"
}

# cd into REPO_DIR on the worker, with a relative REPO_DIR taken from $HOME.
remote_cd() {
  printf 'cd -- %q' "$REPO_DIR"
}

gcloud_base() {
  GCLOUD_TPU_FLAGS=(--zone "$ZONE")
  if [[ -n "$PROJECT" ]]; then
    GCLOUD_TPU_FLAGS+=(--project "$PROJECT")
  fi
}

run_local() {
  if ((DRY_RUN)); then
    printf '+ %s\n' "$(quote_args "$@")"
  else
    "$@"
  fi
}

# ssh WORKER SCRIPT: run the one-line bash SCRIPT on WORKER (a number or all).
ssh_workers() {
  local worker="$1" script="$2"
  gcloud_base
  run_local gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_TPU_FLAGS[@]}" \
    --worker="$worker" --command "$(remote_bash "$script")"
}

require_target() {
  [[ -n "$TPU_NAME" ]] || die "no TPU name: pass --tpu NAME or set TPU_NAME"
  [[ -n "$ZONE" ]] || die "no zone: pass --zone ZONE or set ZONE"
  ((DRY_RUN)) || command -v gcloud >/dev/null 2>&1 ||
    die "gcloud not found; install the Google Cloud CLI and run 'gcloud auth login'"
}

cmd_setup() {
  local git_url="" git_ref=""
  while (($#)); do
    case "$1" in
      --git) git_url="${2:?--git needs a URL}"; shift 2 ;;
      --ref) git_ref="${2:?--ref needs a ref}"; shift 2 ;;
      *) die "setup: unknown argument '$1'" ;;
    esac
  done
  [[ -z "$git_ref" || -n "$git_url" ]] || die "setup: --ref needs --git URL"

  local fetch_code
  if [[ -n "$git_url" ]]; then
    local dir_q url_q
    dir_q="$(printf '%q' "$REPO_DIR")"
    url_q="$(printf '%q' "$git_url")"
    fetch_code="if [ -d ${dir_q}/.git ]; then git -C ${dir_q} fetch --tags origin; else git clone ${url_q} ${dir_q}; fi"
    if [[ -n "$git_ref" ]]; then
      # Through FETCH_HEAD, so a branch, tag or commit id all give the remote's version.
      fetch_code+=" && git -C ${dir_q} fetch origin $(printf '%q' "$git_ref") && git -C ${dir_q} checkout --detach FETCH_HEAD"
    else
      fetch_code+=" && { git -C ${dir_q} symbolic-ref -q HEAD >/dev/null && git -C ${dir_q} pull --ff-only || true; }"
    fi
  else
    local here tarball remote_tar
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    git -C "$here" rev-parse --git-dir >/dev/null 2>&1 ||
      die "setup: $here is not a git checkout; use --git URL"
    tarball="$(mktemp -t flax_xalign_src.XXXXXX)"
    remote_tar="/tmp/flax_xalign_src.$$.tgz"
    # Tracked and untracked-but-not-ignored files: no .venv, caches or runs.
    (cd "$here" && git ls-files -z --cached --others --exclude-standard |
      tar --null -T - -czf "$tarball")
    gcloud_base
    echo "copying $(du -h "$tarball" | cut -f1) of source to all workers"
    run_local gcloud compute tpus tpu-vm scp "$tarball" "${TPU_NAME}:${remote_tar}" \
      "${GCLOUD_TPU_FLAGS[@]}" --worker=all
    rm -f "$tarball"
    fetch_code="mkdir -p -- $(printf '%q' "$REPO_DIR") && tar -xzf ${remote_tar} -C $(printf '%q' "$REPO_DIR") && rm -f ${remote_tar}"
  fi

  local py_q
  py_q="$(printf '%q' "$PYTHON")"
  local install_code
  install_code="if ! command -v ${py_q} >/dev/null; then sudo apt-get update -qq && sudo apt-get install -y -qq python3.11 python3.11-venv; fi"
  install_code+=" && $(remote_cd)"
  install_code+=" && { [ -x .venv/bin/python ] || ${py_q} -m venv .venv; }"
  install_code+=" && .venv/bin/python -m pip install -q --upgrade pip"
  install_code+=" && .venv/bin/python -m pip install -q -e '.[tpu]'"

  ssh_workers all "set -e; ${fetch_code}; ${install_code}; echo \"\$(hostname): installed\""
  # All workers at once, as the TPU runtime wants every host of a slice.
  ssh_workers all "$(remote_cd) && .venv/bin/python -c 'import jax; print(jax.process_index(), jax.process_count(), jax.device_count(), jax.local_device_count())'"
}

cmd_train() {
  local detach=0
  local -a env_args=(PYTHONUNBUFFERED=1)
  while (($#)); do
    case "$1" in
      --nohup) detach=1; shift ;;
      --env)
        [[ "${2:-}" == *=* ]] || die "train: --env needs KEY=VALUE"
        env_args+=("$2"); shift 2 ;;
      --) shift; break ;;
      *) die "train: unknown argument '$1' (flags for flax_xalign.train go after --)" ;;
    esac
  done
  (($#)) || die "train: give the flags for python -m flax_xalign.train after --"

  # Inner script: record our pid, then exec so the pid is python's own.
  local inner
  inner="echo \$\$ > \"logs/train-\$(hostname).pid\" && exec env $(quote_args "${env_args[@]}") .venv/bin/python -m flax_xalign.train $(quote_args "$@")"
  local prelude
  prelude="set -e; $(remote_cd); mkdir -p logs; h=\$(hostname); log=logs/train-\$h.log; pidf=logs/train-\$h.pid"
  prelude+="; if [ -f \"\$pidf\" ] && kill -0 \"\$(cat \"\$pidf\")\" 2>/dev/null; then echo \"\$h: a run is already going (pid \$(cat \"\$pidf\")); use kill first\" >&2; exit 1; fi"
  prelude+="; echo \"=== \$(date -u +%FT%TZ) start on \$h\" >> \"\$log\""

  if ((detach)); then
    ssh_workers all "${prelude}; nohup bash -c $(printf '%q' "$inner") >> \"\$log\" 2>&1 < /dev/null & sleep 2; echo \"\$h: started pid \$(cat \"\$pidf\" 2>/dev/null || echo '?'), log \$PWD/\$log\""
  else
    ssh_workers all "${prelude}; set -o pipefail; bash -c $(printf '%q' "$inner") 2>&1 | tee -a \"\$log\""
  fi
}

cmd_kill() {
  (($# == 0)) || die "kill: takes no arguments"
  local script
  script="$(remote_cd) || exit 0; h=\$(hostname); pidf=logs/train-\$h.pid"
  script+="; if [ -f \"\$pidf\" ] && pid=\$(cat \"\$pidf\") && kill -0 \"\$pid\" 2>/dev/null; then"
  script+=" kill -TERM \"\$pid\"; for _ in \$(seq 20); do kill -0 \"\$pid\" 2>/dev/null || break; sleep 1; done;"
  script+=" if kill -0 \"\$pid\" 2>/dev/null; then kill -KILL \"\$pid\"; echo \"\$h: killed \$pid (KILL)\"; else echo \"\$h: stopped \$pid\"; fi;"
  script+=" else echo \"\$h: no run going\"; fi; rm -f \"\$pidf\""
  script+="; if command -v lsof >/dev/null; then holders=\$(sudo lsof -t /dev/accel* /dev/vfio/* 2>/dev/null | sort -u | tr '\\n' ' '); [ -z \"\$holders\" ] || echo \"\$h: still holding the TPU: pids \$holders\"; fi"
  ssh_workers all "$script"
}

cmd_logs() {
  local worker=0 lines=50 follow=""
  while (($#)); do
    case "$1" in
      --worker) worker="${2:?--worker needs N or all}"; shift 2 ;;
      -n) lines="${2:?-n needs a number}"; shift 2 ;;
      -f) follow="-F"; shift ;;
      *) die "logs: unknown argument '$1'" ;;
    esac
  done
  [[ "$worker" == all || "$worker" =~ ^[0-9]+$ ]] || die "logs: --worker takes a number or all"
  [[ "$lines" =~ ^[0-9]+$ ]] || die "logs: -n takes a number"
  ssh_workers "$worker" "$(remote_cd) && tail -n ${lines} ${follow} logs/train-*.log"
}

cmd_run() {
  [[ "${1:-}" == "--" ]] && shift
  (($#)) || die "run: give a command after --"
  ssh_workers all "$(remote_cd) && $(quote_args "$@")"
}

main() {
  while (($#)); do
    case "$1" in
      --tpu) TPU_NAME="${2:?--tpu needs a name}"; shift 2 ;;
      --zone) ZONE="${2:?--zone needs a zone}"; shift 2 ;;
      --project) PROJECT="${2:?--project needs an id}"; shift 2 ;;
      --repo-dir) REPO_DIR="${2:?--repo-dir needs a path}"; shift 2 ;;
      --python) PYTHON="${2:?--python needs an interpreter}"; shift 2 ;;
      --dry-run) DRY_RUN=1; shift ;;
      -h | --help) usage; exit 0 ;;
      -*) die "unknown option '$1' (see --help)" ;;
      *) break ;;
    esac
  done
  (($#)) || { usage >&2; exit 2; }
  local sub="$1"
  shift
  case "$sub" in
    setup | train | kill | logs | run) ;;
    help) usage; exit 0 ;;
    *) die "unknown subcommand '$sub' (setup, train, kill, logs, run)" ;;
  esac
  require_target
  REPO_DIR="${REPO_DIR#\~/}"  # ssh starts in the remote home; %q would keep a literal ~
  [[ -n "$REPO_DIR" && "$REPO_DIR" != "~" ]] || die "--repo-dir must name a directory"
  "cmd_${sub}" "$@"
}

main "$@"
