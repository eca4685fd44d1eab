"""``python -m actormesh.kernel -f CONNECTION_FILE``: what the actormesh kernelspec runs."""

from actormesh.kernel.kernel import main

main()
