"""Build turbo-gnn (the baseline of issue 13) from its PyPI sdist, offline, and import it.

turbo-gnn's setup.py downloads a prebuilt wheel from GitHub, which the device machine
(no network) cannot do. This script instead unpacks the sdist into a git-ignored
folder, compiles the extension its setup.py declares (the ``CUDAExtension`` call's
sources and flags, read from setup.py itself so a new release needs no edit here) with
torch's JIT loader, and registers the result as ``turbo_gnn._C`` so that the package's
own Python code -- which does ``import turbo_gnn._C`` -- runs unchanged. Nothing of
turbo-gnn is copied into this repository: the sdist and the build stay in ``.turbo/``.

The build is cached in ``.turbo/build`` (ninja's objects and torch's versioned .so), so
a second call on the same machine loads in seconds; a first one takes about 3 minutes on
16 cores for sm_90. The built .so is also copied to ``.turbo/prebuilt/`` under a name
holding the sdist, torch, CUDA and architecture; a later session that carries that file
to a fresh machine imports it directly instead of compiling again.

    python benchmarks/build_turbo_gnn.py                       # .turbo/turbo_gnn-*.tar.gz
    python benchmarks/build_turbo_gnn.py path/to/turbo_gnn-0.1.0rc4.tar.gz --arch 9.0
"""
from __future__ import annotations

import argparse
import ast
import glob
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
import types
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parent.parent
TURBO_DIR = REPO_ROOT / ".turbo"
EXTENSION_NAME = "turbo_gnn_C"     # torch's loader needs an identifier; registered as turbo_gnn._C


def default_sdist() -> Path:
    """The newest turbo_gnn sdist copied into ``.turbo/`` (the bench's default)."""
    found = sorted(TURBO_DIR.glob("turbo_gnn-*.tar.gz"))
    if not found:
        raise FileNotFoundError(f"no turbo_gnn-*.tar.gz in {TURBO_DIR}; copy the sdist there "
                                "(`pip download --no-deps --no-binary :all: turbo-gnn`) or pass its path")
    return found[-1]


def unpack(sdist: Path, build_root: Path) -> Path:
    """The sdist's top folder under `build_root`, extracted once (a marker file says the
    extraction finished, so a run killed mid-way extracts again instead of building a
    half-written tree)."""
    name = sdist.name.removesuffix(".tar.gz")
    root = build_root / name
    marker = build_root / f"{name}.unpacked"
    if marker.is_file() and root.is_dir():
        return root
    build_root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as archive:
        # the "data" filter (no absolute paths, links out of the tree) where Python has it
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(build_root, **safe)
    if not (root / "setup.py").is_file():
        raise FileNotFoundError(f"{sdist} did not unpack to {root}/setup.py")
    marker.write_text(str(sdist) + "\n")
    return root


def extension_spec(setup_py: Path) -> dict[str, Any]:
    """The literal keyword arguments of setup.py's ``CUDAExtension(...)`` call: sources,
    extra_compile_args, libraries (the include dirs are computed there, so they are
    rebuilt in `include_dirs`). Read with `ast`, never executed: setup.py imports the
    network-bound wheel command at module level."""
    tree = ast.parse(setup_py.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "CUDAExtension":
            spec = {}
            for keyword in node.keywords:
                try:
                    spec[keyword.arg] = ast.literal_eval(keyword.value)
                except ValueError:
                    continue                      # computed (include_dirs, library_dirs)
            if "sources" not in spec:
                raise ValueError(f"{setup_py}: CUDAExtension has no literal sources list")
            return spec
    raise ValueError(f"{setup_py}: no CUDAExtension(...) call found")


def _nvidia_pip_dirs(sub: str) -> list[Path]:
    """``<site-packages>/nvidia/<pkg>/<sub>`` folders of NVIDIA's pip packages (torch's
    CUDA libraries), which setup.py also searches for headers and libraries."""
    try:
        import nvidia
    except ImportError:
        return []
    return sorted(Path(p) for root in nvidia.__path__ for p in glob.glob(os.path.join(root, "*", sub)))


def _cuda_home_dirs(sub: str) -> list[Path]:
    from torch.utils.cpp_extension import CUDA_HOME
    if not CUDA_HOME:
        return []
    home = Path(CUDA_HOME)
    return [home / sub, *(Path(p) for p in glob.glob(str(home / "targets" / "*" / sub)))]


def include_dirs(root: Path, libraries: list[str]) -> list[Path]:
    """``csrc`` plus, for each library the toolkit lacks headers of (cusparse_v2.h for
    cusparse), the pip package folder that has them. Pip folders are only added when
    needed: their CUDA runtime headers could differ from nvcc's own."""
    dirs = [root / "csrc"]
    headers = {"cusparse": "cusparse_v2.h"}
    for library in libraries:
        header = headers.get(library)
        if header is None or any((d / header).is_file() for d in _cuda_home_dirs("include")):
            continue
        dirs += [d for d in _nvidia_pip_dirs("include") if (d / header).is_file()][:1]
    return dirs


def link_flags(libraries: list[str]) -> list[str]:
    """``-l<lib>`` where the toolkit has the unversioned ``lib<lib>.so``, else the pip
    package's versioned one by full name (``-l:libcusparse.so.12``) with an rpath."""
    flags = []
    for library in libraries:
        plain = f"lib{library}.so"
        if any((d / plain).is_file() for sub in ("lib64", "lib") for d in _cuda_home_dirs(sub)):
            flags.append(f"-l{library}")
            continue
        for folder in _nvidia_pip_dirs("lib"):
            versioned = sorted(folder.glob(plain + ".*"))
            if versioned:
                flags += [f"-L{folder}", f"-l:{versioned[0].name}", f"-Wl,-rpath,{folder}"]
                break
        else:
            flags.append(f"-l{library}")          # let the linker say what is missing
    return flags


def default_arch() -> str:
    """The visible GPU's compute capability as TORCH_CUDA_ARCH_LIST wants it ("9.0" on
    an H100/H200): one architecture builds several times faster than setup.py's four."""
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError(f"turbo-gnn needs CUDA; torch {torch.__version__} sees no GPU")
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def nvcc_version(cuda_home: Path) -> str:
    """nvcc's ``release X.Y`` line, for the log: a build failure often comes down to it."""
    try:
        done = subprocess.run([str(cuda_home / "bin" / "nvcc"), "--version"], capture_output=True, text=True,
                              timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvcc at {cuda_home} (version unknown: {exc})"
    release = [line for line in done.stdout.splitlines() if "release" in line]
    return f"nvcc at {cuda_home} ({release[-1].strip() if release else 'version unknown'})"


def build_extension(root: Path, build_dir: Path, arch: str | None = None, jobs: int | None = None,
                    verbose: bool = False, log: Callable[[str], None] = print) -> types.ModuleType:
    """Compile (or load from `build_dir`'s cache) the extension setup.py declares."""
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, load
    if not CUDA_HOME:
        raise RuntimeError("no CUDA toolkit found (torch looks at $CUDA_HOME, nvcc on PATH, /usr/local/cuda); "
                           "turbo-gnn must be compiled with nvcc")
    spec = extension_spec(root / "setup.py")
    libraries = list(spec.get("libraries", []))
    flags = spec.get("extra_compile_args", {})
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch or os.environ.get("TORCH_CUDA_ARCH_LIST") or default_arch()
    os.environ["MAX_JOBS"] = str(jobs or os.environ.get("MAX_JOBS") or os.cpu_count() or 1)
    build_dir.mkdir(parents=True, exist_ok=True)
    log(f"turbo-gnn: {nvcc_version(Path(CUDA_HOME))}, torch built with CUDA {torch.version.cuda}; "
        f"building (or loading) {build_dir}")
    return load(name=EXTENSION_NAME, sources=[str(root / source) for source in spec["sources"]],
                extra_cflags=list(flags.get("cxx", [])), extra_cuda_cflags=list(flags.get("nvcc", [])),
                extra_include_paths=[str(d) for d in include_dirs(root, libraries)],
                extra_ldflags=link_flags(libraries), build_directory=str(build_dir), verbose=verbose)


def prebuilt_path(root: Path, arch: str) -> Path:
    """Where the .so built from `root` for this torch, CUDA and `arch` is kept: the name
    says everything the binary depends on, so a stale one is never loaded."""
    import torch
    tag = f"{root.name}-torch{torch.__version__.replace('+', '_')}-sm{arch.replace('.', '')}"
    return TURBO_DIR / "prebuilt" / f"{EXTENSION_NAME}-{tag}.so"


def load_prebuilt(path: Path) -> types.ModuleType:
    """Import the extension module from a .so built earlier (its init symbol is
    ``PyInit_turbo_gnn_C``, so it is loaded under that name)."""
    from importlib.machinery import ExtensionFileLoader
    from importlib.util import module_from_spec, spec_from_loader
    import torch  # noqa: F401 - the extension links against torch's libraries, loaded first
    loader = ExtensionFileLoader(EXTENSION_NAME, str(path))
    module = module_from_spec(spec_from_loader(EXTENSION_NAME, loader))
    loader.exec_module(module)
    return module


def install(sdist: Path | None = None, arch: str | None = None, jobs: int | None = None,
            verbose: bool = False, log: Callable[[str], None] = print) -> types.ModuleType:
    """Unpack, build (cached) and import turbo-gnn; returns the ``turbo_gnn`` package."""
    if "turbo_gnn" in sys.modules:
        return sys.modules["turbo_gnn"]
    sdist = Path(sdist) if sdist else default_sdist()
    build_root = TURBO_DIR / "build"
    begin = time.perf_counter()
    root = unpack(sdist, build_root)
    arch = arch or os.environ.get("TORCH_CUDA_ARCH_LIST") or default_arch()
    kept = prebuilt_path(root, arch)
    if kept.is_file():
        log(f"turbo-gnn: loading the prebuilt {kept.name}")
        extension = load_prebuilt(kept)
    else:
        extension = build_extension(root, build_root / f"ext-{root.name}", arch, jobs, verbose, log)
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(extension.__file__, kept)
    log(f"turbo-gnn extension ready in {time.perf_counter() - begin:.0f} s (sm_{arch.replace('.', '')})")
    return import_package(root, extension)


def import_package(root: Path, extension: types.ModuleType) -> types.ModuleType:
    """Import the unpacked sdist's ``turbo_gnn`` with `extension` as its ``_C``.

    The package folder is put on ``sys.path`` through a folder holding only a link to it,
    so the sdist's other top-level packages (``src``, ``scripts``) shadow nothing.
    """
    site = root.parent / f"site-{root.name}"
    site.mkdir(exist_ok=True)
    link = site / "turbo_gnn"
    if not link.exists():
        link.symlink_to(root / "turbo_gnn", target_is_directory=True)
    sys.path.insert(0, str(site))
    sys.modules["turbo_gnn._C"] = extension       # what `import turbo_gnn._C as _C` finds
    package = importlib.import_module("turbo_gnn")
    package._C = extension
    return package


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sdist", nargs="?", type=Path, help="turbo_gnn-*.tar.gz (default: the one in .turbo/)")
    parser.add_argument("--arch", help="TORCH_CUDA_ARCH_LIST (default: the visible GPU's, e.g. 9.0)")
    parser.add_argument("--jobs", type=int, help="parallel compile jobs (default: $MAX_JOBS, else all cores)")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's command lines")
    args = parser.parse_args(argv)
    turbo = install(args.sdist, args.arch, args.jobs, args.verbose)
    print(f"import turbo_gnn: ok ({turbo.__file__}); _C exports "
          f"{', '.join(name for name in dir(turbo._C) if not name.startswith('_'))}")


if __name__ == "__main__":
    main()
