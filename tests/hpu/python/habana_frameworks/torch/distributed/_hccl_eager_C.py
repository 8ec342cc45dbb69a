# Like the real bridge: the pybind module lives under habana_frameworks/torch/lib/.
from habana_frameworks.torch.lib._hccl_eager_C import *  # noqa: F401,F403
