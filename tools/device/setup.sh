# Sourced by each device call: the carried wheels into /tmp/site, ragen from src/, a private
# RAGEN_HOME (the converted model stays there while the machine is warm).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 RAGEN_HOME=/tmp/ragen-home
export TOKENIZERS_PARALLELISM=false
