"""What every module uses, torch-free: messages, the setup-error exit, MiB figures, and the
re-execution under remat's memory conditions (before torch is imported)."""
import os
import sys

# glibc refuses an mmap threshold above 32 MiB (and then keeps 128 KiB): remat's values exactly.
TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


def argv_option(name, default):
    """An option's value read from sys.argv before argparse runs ("--name V" or "--name=V")."""
    value = default
    for i, a in enumerate(sys.argv):
        if a == name and i + 1 < len(sys.argv):
            value = sys.argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def reexec_under_remat_conditions():
    """Keep freed memory in the process (remat's mallopt calls as glibc tunables); BLAS threads."""
    if os.environ.get("GLIBC_TUNABLES") == TUNABLES:
        return
    os.environ["GLIBC_TUNABLES"] = TUNABLES
    os.environ["OPENBLAS_NUM_THREADS"] = argv_option("--threads", "2")
    os.execv(sys.executable, [sys.executable] + sys.argv)


def log(message):
    print(message, file=sys.stderr, flush=True)


def fail(message):
    log(f"pytorch_side_by_side: {message}")
    sys.exit(2)


MIB = 2.0 ** 20


def mib(n):
    return f"{n / MIB:.1f}" if n >= 10 * MIB else f"{n / MIB:.3f}"
