"""The "actormesh" kernelspec: its content, and installing it (``python -m actormesh
install-kernel``). The same ``kernel.json`` ships in the wheel under ``share/jupyter/kernels``.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

KERNEL_NAME = "actormesh"

# argv[0] stays plain "python": jupyter_client replaces it with the interpreter of whoever
# launches the kernel, so the kernel runs in the server's (or the test's) environment.
# interrupt_mode "message": the kernel interrupts itself and the ranks of the running cell. The
# default ("signal") sends SIGINT to the kernel's whole process group, workers included.
KERNEL_SPEC: dict[str, Any] = {
    "argv": ["python", "-m", "actormesh.kernel", "-f", "{connection_file}"],
    "display_name": "actormesh (Python 3)",
    "language": "python",
    "interrupt_mode": "message",
    "metadata": {"debugger": False},
}


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
            json.dump(KERNEL_SPEC, f, indent=1)
            f.write("\n")
        return str(
            KernelSpecManager().install_kernel_spec(
                path, kernel_name=name, user=user, prefix=prefix
            )
        )
