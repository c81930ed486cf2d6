"""Rebuild `.devpkgs-modes/`: what the global batch-invariant modes need on the GPU machine (no package
index there), small enough to travel with the working tree (64 MiB in all).

    python tools/build_modes_carry.py [--dest .devpkgs-modes]

Three verbatim subsets of the official wheels (vllm 0.34.0, sglang 0.5.23, megatron-core 0.19.2): only the
files the modes' modules import (tools/modes_carry/files_*.json, measured by importing them), each checked
against its wheel's RECORD sha256, plus METADATA (so importlib.metadata reports the version; vLLM needs it to
pick its CUDA platform). The packages' heavy `__init__.py` files are left out on purpose: without them the
folders are namespace packages and those bodies (serving stacks) never run. Plus the third-party wheels the
GPU image lacks. adapters/COMPETITORS.md ("Global modes") lists the result and why each piece is there.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent / "modes_carry"
PLATFORMS = ["manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
             "manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"]
# subset folder -> (wheel requirement, file list, extra trees copied whole)
SUBSETS = {
    "vllm-0.34.0": ("vllm==0.34.0", "files_vllm.json", []),
    "sglang-0.5.23": ("sglang==0.5.23", "files_sglang.json",
                      ["sglang/kernels/jit/include/", "sglang/kernels/jit/csrc/diffusion/timestep_embedding.cuh"]),
    "megatron-core-0.19.2": ("megatron-core==0.19.2", "files_megatron.json", []),
}
WHEELS = ["orjson==3.13.0", "pybase64==1.5.1", "msgspec==0.23.0", "starlette==1.10.0", "pydantic-core==2.50.5",
          "typing-extensions==4.16.0", "pyzmq==27.3.0", "apache-tvm-ffi==0.1.11"]


def download(requirements: list[str], into: Path) -> None:
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
            "3.12", "--implementation", "cp", "-d", str(into)]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    subprocess.run(args + requirements, check=True)


def wheel_for(requirement: str, folder: Path) -> Path:
    name, version = requirement.split("==")
    found = sorted(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if not found:
        raise FileNotFoundError(f"no wheel for {requirement} in {folder}")
    return found[0]


def record_hashes(wheel: zipfile.ZipFile) -> dict[str, str]:
    record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    hashes = {}
    for line in wheel.read(record).decode().splitlines():
        path, digest, _ = line.rsplit(",", 2)
        if digest.startswith("sha256="):
            hashes[path] = digest[len("sha256="):]
    return hashes


def extract_subset(wheel_path: Path, files: list[str], extra: list[str], dest: Path) -> int:
    with zipfile.ZipFile(wheel_path) as wheel:
        hashes = record_hashes(wheel)
        names = wheel.namelist()
        distinfo = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        wanted = set(files)
        wanted |= {n for n in names for e in extra if n == e or (e.endswith("/") and n.startswith(e))}
        wanted |= {f"{distinfo}/{item}" for item in ("METADATA", "WHEEL", "top_level.txt") if f"{distinfo}/{item}" in names}
        wanted |= {n for n in names if n.startswith(f"{distinfo}/licenses/")}
        for name in sorted(n for n in wanted if not n.endswith("/")):
            data = wheel.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if name in hashes and hashes[name] != digest:
                raise ValueError(f"{wheel_path.name}: {name} does not match its RECORD hash")
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return len([n for n in wanted if not n.endswith("/")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path(".devpkgs-modes"))
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "h3bench-modes")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    download([req for req, _, _ in SUBSETS.values()] + WHEELS, args.cache)
    shutil.rmtree(args.dest, ignore_errors=True)
    for folder, (requirement, listing, extra) in SUBSETS.items():
        files = json.loads((HERE / listing).read_text())
        count = extract_subset(wheel_for(requirement, args.cache), files, extra, args.dest / folder)
        print(f"{folder}: {count} files")
    (args.dest / "wheels").mkdir(parents=True)
    for requirement in WHEELS:
        shutil.copy2(wheel_for(requirement, args.cache), args.dest / "wheels")
    total = sum(p.stat().st_size for p in args.dest.rglob("*") if p.is_file())
    print(f"{args.dest}: {total:,} bytes")


if __name__ == "__main__":
    main()
