"""trainbook test stand-in for Intel Gaudi's `habana_frameworks` package (see tests/hpu/README.md).

Only `habana_frameworks.torch` exists; it imitates the eager-mode PyTorch bridge on host memory.
"""
