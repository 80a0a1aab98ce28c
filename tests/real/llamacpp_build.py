"""Build llama.cpp's `llama-server` from the sources PyPI's llama-cpp-python sdist carries.

Run by hand (tests/real/llamacpp.py calls it; 13 minutes on 2 shared cores the
first time). Everything lands in the cache folder, outside the repository:
the sdist, its unpacked sources, the build tree, the binary and a small venv
holding numpy and the sdist's own gguf-py (the `gguf` package of the same
llama.cpp revision, so the GGUF it writes is one this server reads).
"""

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

SDIST = "llama-cpp-python==0.3.36"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)


def cache_dir():
    return Path(os.environ.get("OPENRELAY_REAL_CACHE") or Path.home() / ".cache" / "openrelay-real")


def run(*args, **kwargs):
    print("+", " ".join(map(str, args)), flush=True)
    subprocess.run(list(map(str, args)), check=True, **kwargs)


def sources(cache):
    """The unpacked llama.cpp tree of the sdist (vendor/llama.cpp)."""
    found = sorted(cache.glob("llama_cpp_python-*/vendor/llama.cpp"))
    if found:
        return found[-1]
    archives = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        run(sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d", cache)
        archives = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(archives[-1]) as archive:
        archive.extractall(cache, filter="data")
    return sorted(cache.glob("llama_cpp_python-*/vendor/llama.cpp"))[-1]


def server_binary(cache=None):
    """The path of a built llama-server, building it first when the cache has none."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    binary = cache / "bin" / "llama-server"
    if binary.exists():
        return binary
    tree = sources(cache)
    build = cache / "build"
    jobs = str(os.cpu_count() or 2)
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    run(
        *nice,
        "cmake",
        "-S",
        tree,
        "-B",
        build,
        "-G",
        "Ninja" if shutil.which("ninja") else "Unix Makefiles",
        *CMAKE_FLAGS,
    )
    run(*nice, "cmake", "--build", build, "--target", "llama-server", "-j", jobs)
    binary.parent.mkdir(exist_ok=True)
    shutil.copy2(build / "bin" / "llama-server", binary)
    return binary


def tool_python(cache=None):
    """A venv's python with numpy and the sdist's gguf-py installed (kept in the cache)."""
    cache = cache or cache_dir()
    venv = cache / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        run(sys.executable, "-m", "venv", venv)
        run(python, "-m", "pip", "install", "-q", "numpy", sources(cache) / "gguf-py")
    return python


def server_argv(binary, model, port, *, slots, slot_context=256, threads=1, extra=()):
    """llama-server's command line as the project's real runs start it: `slots` slots of `slot_context`
    tokens each, `threads` compute threads (fixed, so its share of the machine is), `--metrics`."""
    argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", port, "-c", slots * slot_context]
    argv += ["-np", slots, "-t", threads, "--metrics", *extra]
    return [str(arg) for arg in argv]


if __name__ == "__main__":
    print(server_binary())
    print(tool_python())
