"""The module paths the kernel package guide uses (``python -m kernel_zoo.cli.*``).

They are aliases of ``kz`` commands: the same code, output and exit codes.
"""
