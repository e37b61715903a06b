"""``python -m flows`` is the ``focus`` command (the same entry as the console script)."""

from flows.entry import main

main()
