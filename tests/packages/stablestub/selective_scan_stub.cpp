// Stand-in kernels for tests/test_e2e_stable_abi_mamba.py: mamba-ssm-stable's ported
// binding (csrc/selective_scan/selective_scan.cpp) linked without nvcc and without
// libcudart, so that it loads under any torch.  The ops' own checks refuse a CPU tensor
// before a kernel would be launched; these are never called.
#include <cstdint>
#include <cstring>

#include <cuda_runtime_api.h>

#include "selective_scan_stable_compat.h"
#include "selective_scan.h"

template <typename input_t, typename weight_t>
void selective_scan_fwd_cuda(SSMParamsBase&, cudaStream_t) {}

template <typename input_t, typename weight_t>
void selective_scan_bwd_cuda(SSMParamsBwd&, cudaStream_t) {}

#define STUBS(INPUT, WEIGHT)                                                          \
    template void selective_scan_fwd_cuda<INPUT, WEIGHT>(SSMParamsBase&, cudaStream_t); \
    template void selective_scan_bwd_cuda<INPUT, WEIGHT>(SSMParamsBwd&, cudaStream_t);

STUBS(float, float)
STUBS(float, c10::complex<float>)
STUBS(at::Half, float)
STUBS(at::Half, c10::complex<float>)
STUBS(at::BFloat16, float)
STUBS(at::BFloat16, c10::complex<float>)
