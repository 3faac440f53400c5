# First call: keep the first half of the GGUF outside the repository, and say what is there.
set -u
mkdir -p /tmp/hold && cp .gpua/part /tmp/hold/parta && ls -l /tmp/hold/parta
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
