"""Stand-in for `habana_frameworks.torch.core`. Eager mode needs no mark_step; it is kept as a
no-op for code written for lazy mode, as the real eager bridge does."""
import habana_frameworks.torch  # noqa: F401  (loads the plugin)


def mark_step(device_str="", sync=False):
    """No-op in eager mode."""
