"""The "actormesh" kernelspec: its content, and installing it (``python -m actormesh
install-kernel``). The wheel also ships a ``kernel.json`` and the logos under
``share/jupyter/kernels/actormesh``; install-kernel copies the logos from ``kernelspec/`` here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import Any

KERNEL_NAME = "actormesh"
# The same files as share/jupyter/kernels/actormesh's (the kernel tests compare them).
RESOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernelspec")
LOGOS = ("logo-32x32.png", "logo-64x64.png")

# The shipped kernel.json says plain "python": jupyter_client replaces that with its own
# interpreter, right only for a Jupyter in this environment (where pip put that file).
# install-kernel writes this interpreter's absolute path instead, as ``ipykernel install`` does,
# so that a Jupyter in another environment starts the kernel here, where actormesh is.
# interrupt_mode "message": the kernel interrupts itself and the ranks of the running cell. The
# default ("signal") sends SIGINT to the kernel's whole process group, workers included.
KERNEL_SPEC: dict[str, Any] = {
    "argv": ["python", "-m", "actormesh.kernel", "-f", "{connection_file}"],
    "display_name": "actormesh (Python 3)",
    "language": "python",
    "interrupt_mode": "message",
    "metadata": {"debugger": False},
}


def kernel_spec(executable: str | None = None) -> dict[str, Any]:
    """The kernelspec that starts the kernel with ``executable`` (this interpreter)."""
    spec = json.loads(json.dumps(KERNEL_SPEC))
    spec["argv"][0] = executable or sys.executable
    return spec


def install(user: bool = False, prefix: str | None = None, name: str = KERNEL_NAME) -> str:
    """Install the kernelspec; returns the directory it went to.

    ``user`` installs for the current user; ``prefix`` under ``PREFIX/share/jupyter/kernels``
    (``sys.prefix`` for ``--sys-prefix``); neither: the system-wide location.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        os.mkdir(path)
        with open(os.path.join(path, "kernel.json"), "w") as f:
            json.dump(kernel_spec(), f, indent=1)
            f.write("\n")
        for logo in LOGOS:
            shutil.copyfile(os.path.join(RESOURCES, logo), os.path.join(path, logo))
        return str(
            KernelSpecManager().install_kernel_spec(
                path, kernel_name=name, user=user, prefix=prefix
            )
        )
