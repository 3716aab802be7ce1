"""A step between yosys and nextpnr: a CCU2C carry out that nothing reads is left unconnected.

yosys keeps a wire on every cell output, read or not, and nextpnr-ecp5 gives the last
CCU2C of every chain whose COUT has a net a cell of its own to bring the carry out to
the fabric, even when no cell reads it: 371 such cells, 742 LUTs, on the 25F's NIC
(docs/boards.md, "Where nextpnr's packing adds LUTs"). In yosys's JSON an `x` bit is a
port nextpnr leaves unconnected, so each unread COUT becomes `x`.

    python -m optireduce.sim.carry_ends top.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def free_unread_carry_outs(netlist: dict) -> int:
    """Set every CCU2C's COUT that no cell input and no module port reads to `x`, in
    every module of a yosys JSON netlist; returns how many."""
    freed = 0
    for module in netlist["modules"].values():
        cells = module.get("cells", {})
        read = {b for port in module.get("ports", {}).values() for b in port["bits"]}
        for cell in cells.values():
            dirs = cell.get("port_directions", {})
            for name, bits in cell["connections"].items():
                if dirs.get(name) != "output":
                    read.update(b for b in bits if isinstance(b, int))
        for cell in cells.values():
            if cell["type"] != "CCU2C":
                continue
            bits = cell["connections"].get("COUT", [])
            if len(bits) == 1 and isinstance(bits[0], int) and bits[0] not in read:
                cell["connections"]["COUT"] = ["x"]
                freed += 1
    return freed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m optireduce.sim.carry_ends <netlist.json>", file=sys.stderr)
        return 2
    path = Path(argv[0])
    netlist = json.loads(path.read_text())
    freed = free_unread_carry_outs(netlist)
    path.write_text(json.dumps(netlist))
    print(f"carry_ends: {freed} unread CCU2C carry outs left unconnected in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
