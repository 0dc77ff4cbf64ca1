# A tiny real CUDA extension: one kernel, one binding.  Compiles in seconds.
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="tinyext",
    version="0.1.0",
    packages=["tinyext"],
    install_requires=["torch", "ninja"],
    ext_modules=[CUDAExtension("tinyext_cuda", ["csrc/bind.cpp", "csrc/add_one.cu"],
                               extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O2"]})],
    cmdclass={"build_ext": BuildExtension},
)
