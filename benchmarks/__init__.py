"""Performance benchmarks: how fast ragen does a piece of work, against a reference measured in
the same run (an older code path, llama.cpp, TRL, gym-sokoban, the machine's own peak).

Each module is a command run from the repository root, ``python -m benchmarks.NAME [--help]``:
it prints a table and writes ``benchmarks/results/NAME.json``. ``measure`` holds what they
share: the machine's matmul peak and copy bandwidth, and the FLOPs a forward or backward needs.
"""
