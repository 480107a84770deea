"""``python -m streamapp`` is the ``streamapp`` command."""

from .cli import main

main()
