"""`python -m ragen` (and `torchrun -m ragen`) run the command line."""

from ragen.cli import main

raise SystemExit(main())
