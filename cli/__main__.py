"""``python -m cli`` is the ``focus`` command (the same entry as the console script)."""

from cli.entry import main

main()
