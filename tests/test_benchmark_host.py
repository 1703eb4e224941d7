"""hardware.py: bf16 is the default only where the hardware computes it natively, the user's choice wins
(with a warning on a host that would emulate it), and the line every benchmark prints names device, precision and
torch version. Fake /proc/cpuinfo texts; nothing is timed."""
from __future__ import annotations

import torch

from bertrecipe.common import hardware as host

FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2"


def cpuinfo(model: str, *extra_flags: str, processors: int = 2) -> str:
    block = "processor\t: {i}\nvendor_id\t: X\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
    flags = " ".join([FLAGS, *extra_flags])
    return "".join(block.format(i=i, model=model, flags=flags) for i in range(processors))


def test_amx_cpu_defaults_to_bf16(capsys) -> None:
    found = host.cpu_host(cpuinfo("Intel(R) Xeon(R) Platinum 8480+", "avx512f", "amx_bf16", "amx_tile"))
    assert (found.device, found.native_bf16) == ("Intel(R) Xeon(R) Platinum 8480+", True)
    assert "amx_bf16" in found.reason
    assert host.pick_precisions(found, None, ["fp32", "bf16"]) == ["fp32", "bf16"]
    assert capsys.readouterr() == ("", "")  # nothing to explain


def test_avx512_bf16_cpu_defaults_to_bf16() -> None:
    found = host.cpu_host(cpuinfo("AMD EPYC 9654 96-Core Processor", "avx512f", "avx512_bf16"))
    assert found.native_bf16 and host.pick_precisions(found, None, ["bf16"]) == ["bf16"]
    assert "avx512_bf16" in found.reason and "amx_bf16" not in found.reason


def test_avx2_only_cpu_gets_fp32_and_the_reason(capsys) -> None:
    found = host.cpu_host(cpuinfo("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz"))
    assert not found.native_bf16
    assert host.pick_precisions(found, None, ["bf16"]) == ["fp32"]
    assert host.pick_precisions(found, None, ["fp32", "bf16"]) == ["fp32"]  # not fp32 twice
    out = capsys.readouterr().out
    assert "instead of bf16 on Intel(R) Core(TM) i7-8700" in out and "emulate" in out


def test_flags_are_whole_words_on_the_flags_line() -> None:
    """A flag's name elsewhere (a model name, another flag containing it) is no evidence."""
    lookalike = cpuinfo("Not an avx512_bf16 part", "xavx512_bf16", "amx_bf16x")
    assert not host.cpu_host(lookalike).native_bf16


def test_no_proc_cpuinfo_gets_fp32(tmp_path) -> None:
    assert host.read_cpuinfo(tmp_path / "cpuinfo") is None
    found = host.cpu_host(None)
    assert not found.native_bf16 and host.pick_precisions(found, None, ["bf16"]) == ["fp32"]
    assert found.device  # the platform's name for the processor, never empty
    assert "/proc/cpuinfo" in found.reason


def test_an_explicit_bf16_wins_but_warns_on_a_non_native_cpu(capsys) -> None:
    avx2 = host.cpu_host(cpuinfo("AVX2 box"))
    assert host.pick_precisions(avx2, ["bf16"], ["fp32"]) == ["bf16"]
    assert "warning: bf16 requested on AVX2 box" in capsys.readouterr().err
    native = host.cpu_host(cpuinfo("AMX box", "amx_bf16"))
    assert host.pick_precisions(native, ["bf16"], ["fp32"]) == ["bf16"]
    assert host.pick_precisions(avx2, ["fp32"], ["bf16"]) == ["fp32"]
    assert capsys.readouterr().err == ""


def test_gpu_counts_native_bf16_only(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100-SXM2-16GB")
    emulated_too = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: emulated_too.append(including_emulation) or False)
    assert host.detect("cuda").native_bf16 is False and emulated_too == [False]
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    found = host.detect("cuda")
    assert found.device == "Tesla V100-SXM2-16GB" and found.native_bf16


def test_host_line_and_record_name_device_precision_and_torch() -> None:
    found = host.cpu_host(cpuinfo("AMD EPYC", "avx512_bf16"))
    line = host.host_line(found, "bf16")
    assert line == f"AMD EPYC (native bf16); bf16; torch {torch.__version__}"
    assert host.host_record(found, "fp32") == {"device": "AMD EPYC", "native_bf16": True, "precision": "fp32",
                                               "torch": torch.__version__}
