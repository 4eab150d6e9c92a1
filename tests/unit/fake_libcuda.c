/* A stand-in for an old libcuda.so.1 (tests of agoq_gpu_start_failure): a driver that
 * supports CUDA 11.8 only. */
__attribute__((visibility("default"))) int cuDriverGetVersion(int* v) {
  *v = 11080;
  return 0; /* CUDA_SUCCESS */
}
