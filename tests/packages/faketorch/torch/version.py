import os

cuda = os.environ.get("FAKE_TORCH_CUDA", "13.0")
hip = None
