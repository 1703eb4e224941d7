"""The host a figure is measured on, and the precision the benchmarks and the quick start default to there.

Every benchmark prints host_line() with its figures and writes host_record() into its JSON, so that each figure
names its CPU (or GPU), precision and torch version. Mixed precision defaults to bf16 only where the hardware
computes it natively: a CPU with AMX or AVX-512 BF16 (flags amx_bf16, avx512_bf16 in /proc/cpuinfo), a GPU where
torch.cuda.is_bf16_supported() without emulation. Elsewhere torch emulates bf16 matmuls (under 1 GFLOP/s on an
AVX2-only CPU), so a bf16 figure would time the emulation, not the recipe: such hosts get fp32 and the reason.
"""
from __future__ import annotations

import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@dataclass(frozen=True)
class Host:
    device: str  # CPU model name or GPU name
    native_bf16: bool
    reason: str  # why bf16 is or is not native here, printed when it changes a default
    torch: str


def read_cpuinfo(path: Path = CPUINFO) -> str | None:
    """The text of /proc/cpuinfo, None where there is none (macOS, Windows, some containers)."""
    try:
        return path.read_text()
    except OSError:
        return None


def cpu_model(cpuinfo: str | None) -> str:
    match = re.search(r"^model name\s*:\s*(.+)$", cpuinfo or "", re.MULTILINE)
    if match:
        return match.group(1).strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_host(cpuinfo: str | None) -> Host:
    """The CPU's verdict from the text of /proc/cpuinfo (None: no such file)."""
    if cpuinfo is None:
        return Host(cpu_model(None), False, f"no {CPUINFO} to show native bf16 ({' or '.join(NATIVE_BF16_FLAGS)})",
                    torch.__version__)
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:  # whole words: a flag's name inside another must not count
            flags.update(line.split(":", 1)[1].split())
    found = [flag for flag in NATIVE_BF16_FLAGS if flag in flags]
    if found:
        return Host(cpu_model(cpuinfo), True, f"native bf16 ({', '.join(found)})", torch.__version__)
    reason = (f"no {' or '.join(NATIVE_BF16_FLAGS)} in {CPUINFO}, so torch would emulate bf16 matmuls (under "
              "1 GFLOP/s on an AVX2-only CPU)")
    return Host(cpu_model(cpuinfo), False, reason, torch.__version__)


def cuda_host() -> Host:
    """The current GPU's verdict; emulated bf16 (pre-Ampere GPUs) does not count as native."""
    name = torch.cuda.get_device_name()
    if torch.cuda.is_bf16_supported(including_emulation=False):
        return Host(name, True, "native bf16 (torch.cuda.is_bf16_supported)", torch.__version__)
    return Host(name, False, "no native bf16 on this GPU (torch.cuda.is_bf16_supported is False)", torch.__version__)


def recipe_device() -> str:
    """The device the recipe's entry points (run_pretraining.py, run_glue.py, run_squad.py) train on by default."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def detect(device: str = "cpu") -> Host:
    """This machine's CPU, or its GPU for device "cuda": the device that does the timed work."""
    return cuda_host() if device == "cuda" else cpu_host(read_cpuinfo())


def warn_if_emulated(host: Host, precisions: list[str]) -> None:
    """The user's choice stands, but a bf16 figure from a host that emulates it must not pass unremarked."""
    if "bf16" in precisions and not host.native_bf16:
        print(f"warning: bf16 requested on {host.device}: {host.reason}; its figures time the emulation",
              file=sys.stderr, flush=True)


def pick_precisions(host: Host, requested: list[str] | None, default: list[str]) -> list[str]:
    """The user's precisions if given (with a warning for bf16 the host would emulate); otherwise `default`, with
    fp32 in place of bf16 where bf16 is not native, and the reason printed."""
    if requested:
        warn_if_emulated(host, requested)
        return list(requested)
    if host.native_bf16 or "bf16" not in default:
        return list(default)
    chosen = list(dict.fromkeys("fp32" if p == "bf16" else p for p in default))
    print(f"precision {', '.join(chosen)} instead of bf16 on {host.device}: {host.reason}", flush=True)
    return chosen


def host_line(host: Host, precision: str) -> str:
    """What a figure ran on, e.g. 'AMD EPYC (native bf16); bf16; torch 2.13.0+cpu'."""
    bf16 = "native bf16" if host.native_bf16 else "no native bf16"
    return f"{host.device} ({bf16}); {precision}; torch {host.torch}"


def host_record(host: Host, precision: str) -> dict[str, str | bool]:
    """host_line's facts as JSON fields, for every recorded row."""
    # str(): torch.__version__ is a TorchVersion, which a weights-only load of a checkpoint holding it refuses
    return {"device": host.device, "native_bf16": host.native_bf16, "precision": precision, "torch": str(host.torch)}
