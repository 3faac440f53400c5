# Sourced by each device call: the carried wheels into /tmp/site, ragen from src/, a private
# RAGEN_HOME (the converted model stays there while the machine is warm).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 RAGEN_HOME=/tmp/ragen-home
export TOKENIZERS_PARALLELISM=false
# experiments.speedrun runs the `ragen` console script beside the interpreter: ragen is not
# pip-installed there, so put a script in its place.
BIN=$(python3 -c 'import os, sys; print(os.path.dirname(sys.executable))')
[ -x "$BIN/ragen" ] || printf '#!/bin/sh\nexec %s -m ragen "$@"\n' "$(command -v python3)" > "$BIN/ragen"
chmod +x "$BIN/ragen"
