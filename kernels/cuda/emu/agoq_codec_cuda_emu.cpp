/* agoq_codec_cuda.cu compiled for the CPU emulation (agoq_cuda_emu.h): the same source, the
 * kernels run as fibers. A separate file so that the .cu keeps its CUDA language. */
#define AGOQ_CUDA_EMULATION 1
#include "../agoq_codec_cuda.cu"
