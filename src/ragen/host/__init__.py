"""The machine a run is on: torch's thread count from the free cores (threads), and host
memory, its size, what is free, and returning freed heap (memory)."""
