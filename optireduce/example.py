"""The user's entry point on one host or many: the DDP example with the OptiReduce hook.

    torchrun --nnodes=N --nproc-per-node=M --node-rank=I --master-addr=A --master-port=P \\
        -m optireduce.example [--steps S] [--json]

A thin entry: the run is experiments/ddp_example.py (docs/cluster.md).
"""

from __future__ import annotations

from optireduce.experiments.ddp_example import main

if __name__ == "__main__":
    raise SystemExit(main())
