"""The ``focus`` command: one module per command (collect, train, inspect, config,
serve-model, deploy), assembled in :mod:`cli.app`; the console entry is :mod:`cli.entry`.

The command line sits above every other package (deployments -> flows -> tasks ->
storage -> focus): it is the one place that may import them all.
"""
