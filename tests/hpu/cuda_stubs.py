#!/usr/bin/env python3
"""Generate and build stub shared libraries for the CUDA libraries that torch's Linux wheel links
but that a CPU-only machine lacks, so that `import torch` works there.

Why: the PyPI wheel torch==2.13.0 is CUDA 13 enabled. trainbook's .venv installs it --no-deps plus
only nvidia-cuda-runtime and nvidia-cuda-cupti (enough for libtorch_cpu.so, which is all tch needs).
`import torch` however loads torch/_C -> libtorch_python.so -> libtorch_cuda.so, which need cuDNN,
cuBLAS, NCCL, cuSPARSE, ... (~2.3 GB of wheels). These stubs define every symbol torch's libraries
import from those missing libraries (with the right sonames and symbol versions, read from the ELF
files with readelf/nm), so the dynamic loader is satisfied. No stub is ever meant to be called:
CUDA is unavailable (libcudart finds no driver), so torch never reaches them on the CPU paths the
HPU stand-in uses. If one is called anyway it prints its name to stderr and returns 1 (an error
status for the C APIs concerned).

Usage: cuda_stubs.py TORCH_LIB_DIR OUT_DIR   (prints the sonames it stubbed; no-op when none miss)
Then run Python with LD_LIBRARY_PATH=OUT_DIR. Only for tests: never install these next to torch.
"""
import os
import re
import subprocess
import sys


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def needed(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-d", "-W", path))


def verneed(path):
    """version name -> file (soname) it is required from."""
    out, cur, res = run("readelf", "-V", "-W", path), None, {}
    for line in out.splitlines():
        m = re.search(r"Version: \d+\s+File: (\S+)", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"Name: (\S+)\s+Flags", line)
        if m and cur:
            res[m.group(1)] = cur
    return res


def dynsyms(path):
    """(defined names, undefined [(name, version or None)])"""
    defined, undef = set(), []
    for line in run("nm", "-D", "--with-symbol-versions", path).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("U", "w"):
            if parts[0] == "w":
                continue
            name, _, ver = parts[1].partition("@")
            undef.append((name, ver or None))
        elif len(parts) == 3:
            defined.add(parts[2].split("@")[0])
    return defined, undef


def main():
    torch_lib, out_dir = sys.argv[1], sys.argv[2]
    site = os.path.dirname(os.path.dirname(os.path.abspath(torch_lib)))
    torch_dir = os.path.dirname(os.path.abspath(torch_lib))
    scan = [os.path.join(torch_lib, f) for f in sorted(os.listdir(torch_lib)) if ".so" in f]
    scan += [os.path.join(torch_dir, f) for f in os.listdir(torch_dir) if f.startswith("_C") and f.endswith(".so")]
    # libcaffe2_nvrtc.so is only dlopen'ed for CUDA JIT and is the one that needs the driver
    # (libcuda.so.1): never stub the driver, libcudart probes for it to decide CUDA availability.
    scan = [p for p in scan if os.path.isfile(p) and is_elf(p) and "caffe2_nvrtc" not in p]

    # Libraries that exist: torch/lib, nvidia/*/lib wheels, the system's linker cache.
    present = {}
    for d in [torch_lib] + [os.path.join(root, "lib") for root, dirs, _ in os.walk(os.path.join(site, "nvidia"))
                            if "lib" in dirs]:
        if os.path.isdir(d):
            for f in os.listdir(d):
                present.setdefault(f, os.path.join(d, f))
    system = set(re.findall(r"^\s+(\S+) \(", run("/sbin/ldconfig", "-p"), re.M))

    missing = set()
    for p in scan:
        for n in needed(p):
            if n not in present and n not in system and n != "libcuda.so.1":
                missing.add(n)
    if not missing:
        return

    defined = set()
    for p in set(present.values()):
        if is_elf(p):
            defined |= dynsyms(p)[0]
    # symbol -> (soname, version)
    want = {}
    for p in scan:
        vmap = verneed(p)
        for name, ver in dynsyms(p)[1]:
            if ver and vmap.get(ver) in missing:
                want[name] = (vmap[ver], ver)
            elif not ver and name not in defined and not name.startswith(("Py", "_Py")) and name not in want:
                want[name] = (None, None)
    # Unversioned symbols: put them in the library their prefix suggests, else the first one.
    prefixes = [("nccl", "libnccl"), ("cuFile", "libcufile"), ("cusparseLt", "libcusparseLt"),
                ("cusparse", "libcusparse"), ("cudnn", "libcudnn"), ("cublasLt", "libcublasLt"),
                ("cublas", "libcublas"), ("cufft", "libcufft"), ("curand", "libcurand"),
                ("nvrtc", "libnvrtc"), ("cusolver", "libcusolver"), ("nvshmem", "libnvshmem")]
    ordered = sorted(missing)
    per = {s: {} for s in ordered}  # soname -> {version or None: [names]}
    for name, (so, ver) in sorted(want.items()):
        if so is None:
            so = next((s for pre, lib in prefixes if name.startswith(pre)
                       for s in ordered if s.startswith(lib + ".")), ordered[0])
        per[so].setdefault(ver, []).append(name)

    os.makedirs(out_dir, exist_ok=True)
    for so in ordered:
        groups = per[so]
        base = os.path.join(out_dir, so.replace(".so", "_stub"))
        names = sorted(n for ns in groups.values() for n in ns)
        with open(base + ".c", "w") as f:
            f.write("/* generated by tests/hpu/cuda_stubs.py: never meant to be called */\n"
                    "#include <stdio.h>\n"
                    "static int stub(const char *n) { fprintf(stderr, \"cuda stub called: %s (%s)\\n\", n, \"" + so + "\"); return 1; }\n")
            for n in names:
                f.write(f"int {n}(void) {{ return stub(\"{n}\"); }}\n")
        cmd = ["gcc", "-shared", "-fPIC", "-O0", "-w", "-o", os.path.join(out_dir, so), base + ".c", "-Wl,-soname," + so]
        versions = [v for v in groups if v]
        if versions:
            with open(base + ".map", "w") as f:
                for i, v in enumerate(versions):
                    syms = groups[v] + (groups.get(None, []) if i == 0 else [])
                    f.write(v + " { global: " + " ".join(s + ";" for s in syms) + (" local: *;" if i == 0 else "") + " };\n")
            cmd.append("-Wl,--version-script=" + base + ".map")
        subprocess.run(cmd, check=True)
        print(so)


if __name__ == "__main__":
    main()
