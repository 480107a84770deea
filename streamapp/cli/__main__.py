"""``python -m streamapp.cli`` is the ``streamapp`` command."""

from . import main

if __name__ == "__main__":
    main()
