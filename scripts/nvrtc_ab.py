#!/usr/bin/env python3
"""Cold NVRTC compile time of generated sources, side by side: before/after pairs, alternating.

Usage: scripts/nvrtc_ab.py OLD.cu NEW.cu [OLD2.cu NEW2.cu ...] [--arch sm_90a] [--rounds 7]
Each pair is compiled alternately (old, new, old, new, ...) with the options the library uses
(src/gpu/cuda_libs.cpp), so both see the same machine phase; prints min and median ms of each.
Sources come from `pallas cuda NAME [--dtype ...]` on the two trees. Dev tool only (needs
libnvrtc from the CUDA toolkit; no test uses it).
"""
import argparse, ctypes, ctypes.util, os, sys, time


def load_nvrtc():
    for name in ("/usr/local/cuda/lib64/libnvrtc.so", ctypes.util.find_library("nvrtc")):
        try:
            return ctypes.CDLL(name) if name else None
        except OSError:
            pass
    sys.exit("libnvrtc not found (install the CUDA toolkit)")


def compile_ms(lib, src, arch):
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=" + arch.encode(), b"-default-device", b"-std=c++17"]
    t = time.perf_counter()
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    ms = (time.perf_counter() - t) * 1e3
    if rc != 0:
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(log.value.decode()[:4000])
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    if len(a.sources) % 2:
        sys.exit("give OLD NEW pairs")
    lib = load_nvrtc() or sys.exit("libnvrtc not found (install the CUDA toolkit)")
    for old, new in zip(a.sources[::2], a.sources[1::2]):
        srcs = [open(old, "rb").read(), open(new, "rb").read()]
        times = [[], []]
        for _ in range(a.rounds):
            for i in (0, 1):
                times[i].append(compile_ms(lib, srcs[i], a.arch))
        (b, c) = (sorted(t) for t in times)
        print(f"{old} -> {new} ({a.arch}): min {b[0]:.0f} -> {c[0]:.0f} ms, median {b[len(b)//2]:.0f} -> {c[len(c)//2]:.0f} ms")


if __name__ == "__main__":
    main()
